"""Prompt rendering: chat messages to the prompt a model is sent (chat templates, segmented prompts)."""
