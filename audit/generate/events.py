"""What a run reports while it goes, to whoever drives it (the CLI, a test, a script): the
counters (`RunStats`), the events (`GenerationEvents`) and the result."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from audit.generate.probes import ServerProbe
from audit.report.report import Report


@dataclass
class RunStats:
    """Counters of a run, as the progress display shows them."""

    total: int  # prompts in the partition (after --limit)
    resumed: int  # already in the output at start
    written: int = 0
    errors: int = 0
    retries: int = 0
    in_flight: int = 0
    output_tokens: int = 0
    canary: str = "off"  # off | pending | auditing | passed | failed
    started: float = field(default_factory=time.monotonic)

    @property
    def done(self) -> int:
        return self.resumed + self.written

    @property
    def elapsed(self) -> float:
        return max(time.monotonic() - self.started, 1e-9)

    @property
    def tokens_per_second(self) -> float:
        return self.output_tokens / self.elapsed

    @property
    def eta_seconds(self) -> float | None:
        """Seconds left at this run's pace so far, or None before the first sample."""
        finished = self.written + self.errors
        left = self.total - self.done - self.errors
        if finished == 0:
            return None
        return left * self.elapsed / finished


class GenerationEvents:
    """What the core tells whoever shows the run. Override what you need; all default to nothing."""

    def warning(self, message: str) -> None:
        """A problem worth a person's attention that does not stop the run."""

    def notice(self, message: str) -> None:
        """Something worth knowing that is not a problem (a server back in the rotation)."""

    def progress(self, stats: RunStats) -> None:
        """Called after every change of the counters (cheap: throttle rendering yourself)."""

    def canary(self, report: Report) -> None:
        """The canary's audit, passed or failed."""


@dataclass
class GenerationResult:
    """How a run ended."""

    stats: RunStats
    stopped: str | None = None  # None (ran to the end) | "interrupted" | "canary"
    canary_report: Report | None = None
    canary_message: str | None = None
    probes: list[ServerProbe] = field(default_factory=list)
