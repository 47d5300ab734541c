"""A model family as data: its profile (`rules/profiles/*.toml`), prompt endings, thinking modes, markers, images."""
