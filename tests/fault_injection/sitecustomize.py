"""Fault injection for the internal-error tests, in every process of a run.

With this directory on PYTHONPATH, Python imports this module at start-up in the test process,
in `--jobs` workers (spawned) and in Ray workers alike. When `AUDIT_TEST_FAULT=CODE` is set, the
rule CODE raises on every record whose id contains `boom`, as a rule with a bug would; its other
records are judged as usual.
"""

import os

if os.environ.get("AUDIT_TEST_FAULT"):
    from tests.fault_injection.faults import inject

    inject(os.environ["AUDIT_TEST_FAULT"])
