"""Running `audit` as a user whom file permissions bind, even when the tests run as root.

Root reads a file of mode 000 and writes into a read-only directory (the capabilities
CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH): to see what a user sees, `setpriv` drops them from
the command's bounding set and it runs as root without them. Without root nothing is dropped.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

DROP_OVERRIDE = ("--bounding-set=-dac_override,-dac_read_search",)


def audit_bound_by_permissions(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    """`audit ARGS` in a process that file permissions bind (the test's AUDIT_CACHE_DIR is
    inherited, so the result cache is on); skips when root cannot drop its override."""
    command = [sys.executable, "-m", "audit", *args]
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("running as root without setpriv (util-linux): cannot drop the permission override")
        command = [setpriv, *DROP_OVERRIDE, *command]
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, env=environment, timeout=300)
