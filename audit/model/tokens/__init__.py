"""The tokenizer: a folder loaded and cached, its fast paths, ids to text and back, ids as flat arrays."""
