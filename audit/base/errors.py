"""Errors that stop a run before any verdict: usage, configuration and input errors.

Each carries one line that says what is wrong and what to do; the CLI prints it and exits 2.
Bad *records* never raise: they become findings with their line number; an exception that
still escapes on one (a bug) is named on one line (`one_line`) in its internal-error finding.
"""


class AuditError(Exception):
    """A usage, configuration or input error (exit code 2)."""


class ConfigError(AuditError):
    """A rule set, profile or tokenizer that cannot be used as given."""


class RunStopped(ConfigError):
    """A configuration error found while records are audited (the trainer's own process stopped
    or gave no answer in time): it ends the run wherever it is raised, never counted as the
    internal error of the records at hand."""


class InputError(AuditError):
    """A target that cannot be audited at all (missing, empty, not a file)."""


def one_line(exc: BaseException) -> str:
    """An unexpected exception as `Type: message`, on one line, at most 300 characters: how an
    internal error is named in a finding (the traceback is kept apart)."""
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}"[:300] if text else type(exc).__name__
