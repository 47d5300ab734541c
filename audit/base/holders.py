"""Who holds an output's lock: the record a run leaves in it, and that record as one line.

A local output's lock (`audit.base.files.lock_output`) and an object storage prefix's
(`audit.base.object_locks.lock_prefix`) say the same about their holder.
"""

from __future__ import annotations

import os
import shlex
import socket
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from audit.base import inert

# What the lock file may say about its holder: a few short fields, shown in one line.
_HOLDER_FIELDS = ("pid", "host", "command", "started_at")
_HOLDER_FIELD_LIMIT = 300


def holder_record(command: str | None = None) -> dict[str, Any]:
    """Who this run is, as a lock records its holder: pid, host, command line, start time."""
    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "command": command or shlex.join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "started_at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


def describe_holder(data: Any) -> str:
    """A lock's holder as one line of text (what a lock says is not trusted)."""
    if not isinstance(data, dict):
        return "holder not recorded"
    fields = {k: inert.terminal(data.get(k), _HOLDER_FIELD_LIMIT) for k in _HOLDER_FIELDS}
    started = fields["started_at"]
    return f"pid {fields['pid']} on {fields['host']}, started {started}: {fields['command']}"
