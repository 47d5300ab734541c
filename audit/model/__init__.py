"""Model facts: what a family's tokenizer, chat template and tool-call grammar are. A family is
data (`rules/profiles/*.toml`); the code here reads it, renders prompts, decodes and encodes."""
