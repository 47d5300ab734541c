"""The `audit` command line: one module per command, all registered on one typer app."""

from audit.base.memory import configure_allocators

# First, before polars is loaded: its allocator reads its settings then (see audit.base.memory).
configure_allocators()

from audit.cli import (  # noqa: F401  (importing a command's module registers it)
    catalog,
    check,
    export,
    gate,
    generate,
    history,
    inspection,
    trainer_view,
    watch,
)
from audit.cli.app import app, main

__all__ = ["app", "main"]
