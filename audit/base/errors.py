"""Errors that stop a run before any verdict: usage, configuration and input errors.

Each carries one line that says what is wrong and what to do; the CLI prints it and exits 2.
Bad *records* never raise: they become findings with their line number.
"""


class AuditError(Exception):
    """A usage, configuration or input error (exit code 2)."""


class ConfigError(AuditError):
    """A rule set, profile or tokenizer that cannot be used as given."""


class InputError(AuditError):
    """A target that cannot be audited at all (missing, empty, not a file)."""
