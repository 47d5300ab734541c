"""The one code the engine reports for itself: a rule that raised on a record."""

from __future__ import annotations

import polars as pl

from audit.checks.base import Rule, empty_findings
from audit.records.batch import Batch


class InternalError(Rule):
    """A rule raised on the record: a bug in audit, not a judgement of the data.

    What it checks:
        Nothing of the data. Every rule is meant to be total over any record the input
        contract admits; when one still raises (an exception, or a panic in a native
        library), the engine runs it again on each half of the block, down to the records it
        raises on alone. Each such record gets this finding, naming the rule and the
        exception; every other record keeps its findings and the report is written. A line
        the reading itself raises on (rather than reading it or refusing it as INT001/INT002)
        gets it too, naming `reader`. The run
        then exits 2 (the tool broke), whatever the verdict, and says how many records hit an
        internal error. Always on: a rule set cannot select it away or change its severity.

    Why it matters:
        A record nobody could judge is not a clean record: the gate quarantines it, and a
        CI job sees exit 2 rather than a pass it did not earn. One bad record never costs
        the report of the ten thousand good ones around it.

    Example:
        line 412  ERR001  TCL002 raised IndexError: index 4294967295 is out of bounds ...

    Fix:
        Run the command again with `--debug` (or `AUDIT_DEBUG=1`) to print each traceback,
        and report it with the line (`audit inspect TARGET --line N` shows the record). The
        JSON report holds the tracebacks too, under `internal_errors`.
    """

    code = "ERR001"
    name = "internal-error"
    always_on = True

    def check(self, batch: Batch) -> pl.DataFrame:
        # The engine reports these records itself (audit.engine.isolation); no record is judged here.
        return empty_findings()
