"""Tool calls: each family's call grammar, the readers that take calls out of text, their values judged."""
