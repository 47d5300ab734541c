"""Every finding of a run, kept on disk in line order: memory follows the input, not the findings.

A file of a million bad records has millions of findings; held as Python objects (or even one
polars frame, copied while sorted and serialised) they took gigabytes. The engine instead
appends each block's findings, sorted by line then rule, as one Parquet part in a temporary
directory; the findings of file-level rules (duplicate ids), known only at the end, are a
separate part merged in by line range when read. Readers stream them back in line order
(`batches`), ask polars to aggregate them lazily (`scan`), or take the first few (`head`);
`collect()` materialises all of them for callers that want one frame (small runs, tests).
"""

from __future__ import annotations

import itertools
import shutil
import tempfile
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import polars as pl

FINDINGS_SCHEMA: dict[str, pl.DataType] = {
    "line": pl.UInt32(),
    "id": pl.String(),
    "rule": pl.String(),
    "severity": pl.String(),
    "position": pl.Int64(),
    "field": pl.String(),
    "message": pl.String(),
}

_SORT = ("line", "rule")
_counter = itertools.count()


def empty_findings_frame() -> pl.DataFrame:
    """A findings frame with no rows."""
    return pl.DataFrame(schema=FINDINGS_SCHEMA)


@dataclass(frozen=True)
class FindingsPart:
    """One block's findings: a Parquet file (or a frame in memory) covering lines up to `last_line`."""

    source: Path | pl.DataFrame
    last_line: int
    rows: int

    def read(self) -> pl.DataFrame:
        return self.source if isinstance(self.source, pl.DataFrame) else pl.read_parquet(self.source)

    def scan(self) -> pl.LazyFrame:
        return self.source.lazy() if isinstance(self.source, pl.DataFrame) else pl.scan_parquet(self.source)


def spill_part(frame: pl.DataFrame, last_line: int, directory: Path | None) -> FindingsPart:
    """`frame` (sorted by line, then rule) as a part: a Parquet file in `directory`, or kept in memory.

    Small parts stay in memory (a file per block of a small file costs more than it saves).
    """
    if directory is None or frame.height < SPILL_ROWS:
        return FindingsPart(frame, last_line, frame.height)
    path = directory / f"part-{next(_counter):06d}-{last_line}.parquet"
    frame.write_parquet(path, compression="lz4", statistics=True)
    return FindingsPart(path, last_line, frame.height)


# Parts with fewer findings than this stay in memory: a few MB at most.
SPILL_ROWS = 20_000


class FindingsLog:
    """The findings of one file, in parts ordered by line; see the module docstring."""

    def __init__(
        self,
        parts: list[FindingsPart] | None = None,
        file_level: pl.DataFrame | None = None,
        directory: Path | None = None,
    ):
        self.parts = list(parts or [])
        self.file_level = file_level if file_level is not None else empty_findings_frame()
        self.directory = directory
        if directory is not None:
            # The spill directory lives as long as the log that reads it.
            self._cleanup = weakref.finalize(self, shutil.rmtree, directory, True)

    @classmethod
    def spill_directory(cls) -> Path:
        """A new private temporary directory for a run's parts."""
        return Path(tempfile.mkdtemp(prefix="audit-findings-"))

    @classmethod
    def from_frame(cls, frame: pl.DataFrame) -> FindingsLog:
        """A log over findings already in memory (a report read back, a small audit)."""
        frame = frame.sort(*_SORT, maintain_order=True)
        last = int(frame["line"].max()) if frame.height else 0  # type: ignore[arg-type]  # UInt32
        return cls([FindingsPart(frame, last, frame.height)])

    @property
    def height(self) -> int:
        """How many findings."""
        return sum(part.rows for part in self.parts) + self.file_level.height

    def is_empty(self) -> bool:
        return self.height == 0

    def batches(self) -> Iterator[pl.DataFrame]:
        """The findings in line order (then rule), one part at a time, file-level ones merged in.

        All findings of a line are in the same batch.
        """
        extra = self.file_level.sort(*_SORT, maintain_order=True)
        lines = extra["line"]
        taken = 0
        for part in self.parts:
            upto = int(lines.search_sorted(part.last_line, side="right")) if extra.height else 0
            frame = part.read()
            if upto > taken:
                frame = pl.concat([frame, extra.slice(taken, upto - taken)]).sort(*_SORT, maintain_order=True)
                taken = upto
            if frame.height:
                yield frame
        if taken < extra.height:
            yield extra.slice(taken)

    def per_rule(self, example_lines: int) -> dict[str, tuple[int, list[int]]]:
        """Per rule: how many lines it flags, and the first `example_lines` of them.

        Counted batch by batch (all findings of a line are in one batch, so the counts add up
        exactly): memory holds one part, however many findings the file has.
        """
        counts: dict[str, int] = {}
        examples: dict[str, list[int]] = {}
        for batch in self.batches():
            found = batch.group_by("rule").agg(
                pl.col("line").n_unique().alias("failing"),
                pl.col("line").unique().bottom_k(example_lines).sort().alias("lines"),
            )
            for rule, failing, lines in found.iter_rows():
                counts[rule] = counts.get(rule, 0) + failing
                examples[rule] = sorted({*examples.get(rule, []), *lines})[:example_lines]
        return {rule: (counts[rule], examples[rule]) for rule in counts}

    def lines_with(self, severity: str) -> int:
        """How many lines have a finding of `severity`, counted batch by batch."""
        return sum(batch.filter(pl.col("severity") == severity)["line"].n_unique() for batch in self.batches())

    def scan(self) -> pl.LazyFrame:
        """All findings as one lazy frame (not in line order across parts): for aggregates."""
        frames = [part.scan() for part in self.parts]
        if self.file_level.height:
            frames.append(self.file_level.lazy())
        if not frames:
            return empty_findings_frame().lazy()
        return pl.concat(frames, how="vertical")

    def head(self, n: int) -> pl.DataFrame:
        """The first `n` findings in line order."""
        taken: list[pl.DataFrame] = []
        count = 0
        for batch in self.batches():
            taken.append(batch.head(n - count))
            count += taken[-1].height
            if count >= n:
                break
        return pl.concat([empty_findings_frame(), *taken]) if taken else empty_findings_frame()

    def collect(self) -> pl.DataFrame:
        """Every finding in one frame, in line order (memory grows with the findings)."""
        return pl.concat([empty_findings_frame(), *self.batches()], how="vertical")

    def save(self, directory: Path) -> list[dict[str, int | str]]:
        """Write the parts into `directory` (e.g. a cache entry); their index, to `load` them."""
        index: list[dict[str, int | str]] = []
        for number, part in enumerate([*self.parts, None]):
            if part is None:
                frame, last_line = self.file_level, -1
            else:
                frame, last_line = part.read(), part.last_line
            name = f"findings-{number:06d}.parquet"
            frame.write_parquet(directory / name, compression="lz4", statistics=True)
            index.append({"file": name, "last_line": last_line, "rows": frame.height})
        return index

    @classmethod
    def load(cls, directory: Path, index: list[dict[str, int | str]]) -> FindingsLog:
        """A log over parts `save` wrote (read lazily from there; the directory must stay)."""
        parts: list[FindingsPart] = []
        file_level = empty_findings_frame()
        for entry in index:
            path = directory / str(entry["file"])
            if pl.read_parquet_schema(path) != pl.Schema(FINDINGS_SCHEMA):
                raise ValueError(f"{path}: not a findings part")
            if entry["last_line"] == -1:
                file_level = pl.read_parquet(path)
            else:
                parts.append(FindingsPart(path, int(entry["last_line"]), int(entry["rows"])))
        return cls(parts, file_level)
