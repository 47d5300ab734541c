"""Memory handed back to the system as an audit goes, so that a run's peak follows one block.

An audit allocates and frees the same few hundred megabytes block after block. polars keeps
its memory in jemalloc, which by default holds freed pages for half a second and then for
another second before it returns them (`dirty_decay_ms:500,muzzy_decay_ms:1000`, set by
polars when it is loaded): blocks follow each other faster than that, so the pages of several
blocks' frames pile up. polars reads the setting from `_RJEM_MALLOC_CONF` when it is loaded
(pola-rs/polars#23128, a later key wins): here, pages are returned when freed.

Measured on the 10,000-record benchmark (`benchmarks/bench_check.py`): ~25 MB less at the
peak for ~0.5 s of system time. glibc's own settings were measured too and left alone: a fixed
mmap threshold and trim threshold took another ~10 MB off the peak for ~0.7 s more (every
large buffer mapped and unmapped afresh), a poor trade.

It is a process-wide choice, made by the process that runs audits (the CLI at start-up, and
its `--jobs` workers inherit it), not by importing the library. A setting the user made is
kept: `_RJEM_MALLOC_CONF=dirty_decay_ms:500,muzzy_decay_ms:1000` restores polars' default.
"""

from __future__ import annotations

import os
import sys

# polars' jemalloc: freed pages returned when freed (muzzy pages likewise).
JEMALLOC_SETTINGS = "dirty_decay_ms:0,muzzy_decay_ms:0"


def configure_allocators() -> None:
    """Make polars' allocator return freed memory promptly (see the module docstring).

    Call it before polars is imported for the setting to apply; a setting the user made
    (`_RJEM_MALLOC_CONF`) is kept.
    """
    if "polars" not in sys.modules:
        os.environ.setdefault("_RJEM_MALLOC_CONF", JEMALLOC_SETTINGS)
