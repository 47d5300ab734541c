"""Memory handed back to the system as an audit goes, so that a run's peak follows one block.

An audit allocates and frees the same few hundred megabytes block after block. Two allocators
hold that memory, and by default both keep what was freed in ways that grow with the run:

* glibc's malloc (Python's large buffers, numpy arrays, the tokenizers) raises its mmap
  threshold each time a large buffer is freed, so later buffers of that size come from the heap,
  whose freed middle is never given back. A fixed threshold keeps every large buffer mapped on
  its own, returned the moment it is freed (`mallopt(M_MMAP_THRESHOLD)`), and `malloc_trim`
  gives back what a one-off allocation left (building the fast encoder).
* jemalloc inside polars keeps freed pages for ten seconds (`dirty_decay_ms`). polars reads its
  settings from `_RJEM_MALLOC_CONF` when it is loaded (pola-rs/polars#23128): this returns
  pages when freed.

Both are process-wide choices, made by the process that runs audits (the CLI at start-up, each
`--jobs` worker), not by importing the library. Elsewhere than glibc on Linux they do nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
from functools import cache
from typing import Any

# Buffers from this size up get their own mapping, returned to the system when freed.
MMAP_THRESHOLD = 256 << 10
# Free memory at the top of the heap beyond this is returned at once.
TRIM_THRESHOLD = 1 << 20
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
# polars' jemalloc: freed pages returned when freed (muzzy pages likewise).
JEMALLOC_SETTINGS = "dirty_decay_ms:0,muzzy_decay_ms:0"


@cache
def _glibc() -> Any | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.gnu_get_libc_version  # noqa: B018 - only glibc has it (not musl)
    except (OSError, AttributeError):
        return None
    return libc


def configure_allocators() -> None:
    """Make the process's allocators return freed memory promptly (see the module docstring).

    Call it before polars is imported for its setting to apply; a setting the user made
    (`_RJEM_MALLOC_CONF`, `MALLOC_MMAP_THRESHOLD_`, ...) is kept.
    """
    if "polars" not in sys.modules:
        os.environ.setdefault("_RJEM_MALLOC_CONF", JEMALLOC_SETTINGS)
    libc = _glibc()
    if libc is None:
        return
    if "MALLOC_MMAP_THRESHOLD_" not in os.environ:
        libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)
    if "MALLOC_TRIM_THRESHOLD_" not in os.environ:
        libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)


def release_free_memory() -> None:
    """Return to the system the heap memory that is free (after a large one-off allocation)."""
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)
