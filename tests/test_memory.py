"""Memory given back as an audit goes: the allocator setting the command line makes."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from audit.base.memory import JEMALLOC_SETTINGS

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux allocators")

_RSS = "def rss():\n    return int(open('/proc/self/statm').read().split()[1]) * os.sysconf('SC_PAGE_SIZE') >> 20\n"


def _run(code: str, **env: str) -> str:
    environment = {k: v for k, v in os.environ.items() if k not in ("_RJEM_MALLOC_CONF",)}
    environment.update(env)
    result = subprocess.run(
        [sys.executable, "-c", "import os\n" + _RSS + textwrap.dedent(code)],
        capture_output=True, text=True, env=environment, check=True,
    )
    return result.stdout.strip()


def test_the_command_line_sets_polars_allocator_before_loading_it() -> None:
    """polars returns freed memory at once in the CLI (its jemalloc reads the setting on load),
    not after ten seconds as by default; a user's own setting is kept; importing the library
    changes nothing."""
    freed = """
        {imports}
        import numpy as np, polars as pl
        base = rss()
        column = pl.Series(np.arange(40_000_000, dtype=np.int64)) * 2
        del column
        print(os.environ.get("_RJEM_MALLOC_CONF"), rss() - base)
    """
    # polars puts its own defaults first; the last setting of a key wins.
    setting, kept_mb = _run(freed.format(imports="import audit.cli")).split()
    assert setting.endswith("," + JEMALLOC_SETTINGS) and int(kept_mb) < 50  # of 320 MB
    setting, kept_mb = _run(freed.format(imports="import audit.engine.runner, audit.records.reader")).split()
    assert JEMALLOC_SETTINGS not in setting and int(kept_mb) > 200  # polars' default keeps them
    own = _run("import audit.cli, polars\nprint(os.environ['_RJEM_MALLOC_CONF'])", _RJEM_MALLOC_CONF="narenas:1")
    assert own.endswith(",narenas:1") and JEMALLOC_SETTINGS not in own
