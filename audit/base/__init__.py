"""Base: errors, TOML, atomic writes, object storage paths, inert text, the allocator setting,
no model hub. Imports nothing else of the package."""
