"""How an answer from a server is taken: a result, worth another attempt (`Transient`), a server
gone from the rotation (`Unreachable`), a prompt refused (`Rejected`), or no server at all."""

from __future__ import annotations

from audit.base.errors import AuditError


class ServerError(AuditError):
    """No server can be used (none answers /health)."""


class Transient(Exception):
    """A failed attempt worth retrying, with the status and the delay the server asked for."""

    def __init__(self, reason: str, status: int | None = None, retry_after: float | None = None):
        super().__init__(reason)
        self.status = status
        self.retry_after = retry_after


class Unreachable(Transient):
    """The server refused the connection (or could not be reached): it leaves the rotation."""


class Rejected(Exception):
    """The server refused this prompt (a 4xx that retrying will not change)."""

    def __init__(self, reason: str, status: int):
        super().__init__(reason)
        self.status = status


def describe(exc: BaseException) -> str:
    """An exception as one line: its type and message."""
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
