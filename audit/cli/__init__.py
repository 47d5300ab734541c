"""The `audit` command line: one module per command, all registered on one typer app."""

from audit.cli import catalog, check  # noqa: F401  (registers the commands)
from audit.cli import gate, history  # noqa: F401  (registers gate, report, diff)
from audit.cli import inspect  # noqa: F401  (registers inspect)
from audit.cli import generate, watch  # noqa: F401  (registers generate, watch)
from audit.cli.app import app, main

__all__ = ["app", "main"]
