"""The prompts file: read, normalised and validated here for every command.

A prompts file is JSONL, Parquet, Arrow, or a folder `datasets`' `save_to_disk` wrote
(`audit.generate.datasets_in`), of rows in one of the shapes datasets come in: this project's
own (`id`, `messages`, optional `tools` and `chat_template_kwargs`, an object of extra arguments
for the prompt renderer, e.g. gpt-oss's `reasoning_effort`), OpenAI `messages`, ShareGPT
`conversations`, UltraChat (`messages`, `prompt`, `prompt_id`). Each row is normalised into chat
messages (`audit.generate.conversations`): ShareGPT roles mapped, the dataset's own trailing
answers dropped; a row that cannot be a prompt is refused with its reason and counted, never
sent. A row's id is its `id` (else `prompt_id`, `conversation_id`), else the file's name and the
row's number; ids are unique in the file.

`audit generate` sends these prompts; `audit check --prompts` gives TPL001 the same prompts to
re-render. What is wrong with the file itself (a line that is not JSON, a repeated id, no prompt
left to send) is one error naming the file and row (exit 2), before anything is sent or audited;
`summarise_prompts` says what was read, normalised, dropped and refused, before the first request.
A reader that skips bad lines (`audit generate --skip-bad-lines`) counts each JSONL line that is
not a JSON object instead, with its number and reason.

A row's images (`audit.generate.image_parts` places them, `audit.generate.prompt_images` reads
them against the file's folder) are checked here too: a row whose image cannot be read is
refused like any other.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from audit.base.errors import InputError
from audit.generate import datasets_in
from audit.generate.conversations import (
    NORMALISATIONS,
    REFUSALS,
    Dropped,
    Normalised,
    Refused,
    normalise_row,
)
from audit.generate.prompt_images import ImageIntake, PromptImage

CONTAINER_NAMES = {
    "jsonl": "JSONL",
    "parquet": "Parquet",
    "arrow-file": "Arrow",
    "arrow-stream": "Arrow stream",
    "datasets": "datasets folder",
}


@dataclass(frozen=True)
class Prompt:
    """One prompt of the file, normalised: what the chat template is given."""

    line: int  # the row's number: its line in JSONL (from 1), its row in a table (from 0)
    id: str | int
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    chat_template_kwargs: dict[str, Any] | None = None
    where: str = ""  # "prompts.jsonl:12" or "data.parquet row 12"
    images: tuple[PromptImage, ...] = ()  # in the order of the messages' image parts

    @property
    def key(self) -> str:
        """The id as the output and the audit compare it (a string)."""
        return str(self.id)

    def source(self) -> dict[str, Any]:
        """The prompt in the shape a record carries it: `messages`, `tools`, `chat_template_kwargs`."""
        return {
            "messages": self.messages,
            "tools": self.tools,
            "chat_template_kwargs": self.chat_template_kwargs,
        }


@dataclass
class PromptSummary:
    """What reading a prompts file found: rows, prompts, normalisations, refusals and drops."""

    path: Path
    container: str = ""  # a key of CONTAINER_NAMES
    read: int = 0  # rows read (a JSONL file's blank lines are not rows)
    prompts: int = 0  # rows that became prompts
    dropped: int = 0  # rows with nothing to prompt with (a null or empty conversation)
    normalised: Counter[str] = field(default_factory=Counter)  # NORMALISATIONS key -> prompts
    refused: Counter[str] = field(default_factory=Counter)  # REFUSALS key -> rows
    first_refused: dict[str, str] = field(default_factory=dict)  # kind -> "where: reason"
    first_dropped: str = ""  # "where: reason" of the first dropped row
    keys: list[str] = field(default_factory=list)  # the prompts' ids, in order
    skipped: int = 0  # bad JSONL lines skipped (only when asked to skip them)
    skipped_lines: list[tuple[int, str]] = field(default_factory=list)  # (line, reason), the first LISTED_SKIPS
    images: int = 0  # images the prompts send

    @property
    def refused_rows(self) -> int:
        return sum(self.refused.values())

    @property
    def notable(self) -> bool:
        """Did any row need normalising, or was any refused or dropped? (Else the file was
        prompts as the generator takes them, and the counts say nothing the run does not.)"""
        return bool(self.normalised or self.refused or self.dropped or self.skipped or self.images)

    def skipped_record(self) -> dict[str, Any]:
        """The skipped lines as generation.json records them: how many, and the first ones."""
        return {
            "count": self.skipped,
            "lines": [{"line": line, "reason": reason} for line, reason in self.skipped_lines],
        }

    def lines(self) -> list[str]:
        """The summary for people, a few plain lines (data in it is untrusted: quote it inert)."""
        container = CONTAINER_NAMES.get(self.container, self.container)
        head = (
            f"prompts: {self.read:,} rows read from {self.path} ({container}): "
            f"{self.prompts:,} to send" + (f" (with {self.images:,} images)" if self.images else "")
            + f", {self.refused_rows:,} refused, {self.dropped:,} dropped"
            + (f", {self.skipped:,} bad lines skipped" if self.skipped else "")
        )
        lines = [head]
        if self.normalised:
            lines.append(
                "  normalised: "
                + "; ".join(f"{n:,} {NORMALISATIONS[k]}" for k, n in _by_count(self.normalised))
            )
        for kind, count in _by_count(self.refused):
            lines.append(
                f"  refused {count:,}: {REFUSALS[kind]} (first: {self.first_refused[kind]})"
            )
        if self.dropped:
            lines.append(f"  dropped {self.dropped:,}: nothing to prompt with (first: {self.first_dropped})")
        for line, reason in self.skipped_lines:
            lines.append(f"  skipped {self.path}:{line}: {reason}")
        if self.skipped > len(self.skipped_lines):
            lines.append(
                f"  skipped {self.skipped - len(self.skipped_lines):,} more bad lines "
                f"(the first {LISTED_SKIPS:,} are listed here and in generation.json)"
            )
        return lines


# Skipped lines listed one by one (in the summary and generation.json); all are counted.
LISTED_SKIPS = 100


def _by_count(counts: Counter[str]) -> list[tuple[str, int]]:
    return sorted(counts.items(), key=lambda item: (-item[1], item[0]))


def image_intake(path: Path, fetch: bool = False, vision: bool = True) -> ImageIntake:
    """How the images of the prompts at `path` are read: relative to the file's folder (a
    `datasets` folder's own)."""
    return ImageIntake(path if path.is_dir() else path.parent, fetch=fetch, vision=vision)


def _read(
    path: Path,
    limit: int | None,
    split: str | None,
    summary: PromptSummary,
    skip_bad_lines: bool = False,
    images: ImageIntake | None = None,
) -> Iterator[Prompt]:
    """Every prompt of the file in order, at most `limit`, counting what happened in `summary`."""
    intake = images or image_intake(path)
    container = datasets_in.open_container(path, split)
    summary.container = container.kind
    unit = "line" if container.kind == "jsonl" else "row"
    first_seen: dict[str, int] = {}
    for row in datasets_in.iter_rows(container, skip_bad_lines):
        if limit is not None and summary.prompts >= limit:
            break
        summary.read += 1
        if row.problem is not None:
            summary.skipped += 1
            if len(summary.skipped_lines) < LISTED_SKIPS:
                summary.skipped_lines.append((row.number, row.problem))
            continue
        if row.value is None:
            result: Any = Refused(
                "too_large",
                f"a line of {row.size:,} bytes, over the {datasets_in.MAX_ROW_BYTES:,} a row may have",
            )
        else:
            result = normalise_row(row.value, from_table=row.from_table)
        placed: Any = ()
        if isinstance(result, Normalised) and result.images:
            placed = intake.read(result.images)
            result = placed if isinstance(placed, Refused) else result
        if isinstance(result, Refused):
            summary.refused[result.kind] += 1
            summary.first_refused.setdefault(result.kind, f"{row.where}: {result.reason}")
            continue
        if isinstance(result, Dropped):
            summary.dropped += 1
            summary.first_dropped = summary.first_dropped or f"{row.where}: {result.reason}"
            continue
        prompt_id = result.id if result.id is not None else row.row_id
        key = str(prompt_id)
        if key in first_seen:
            raise InputError(
                f"{row.where}: id {prompt_id!r} repeats {unit} {first_seen[key]}; "
                "every prompt needs its own id"
            )
        first_seen[key] = row.number
        summary.prompts += 1
        summary.normalised.update(result.notes)
        summary.keys.append(key)
        summary.images += len(placed)
        yield Prompt(
            line=row.number,
            id=prompt_id,
            messages=result.messages,
            tools=result.tools,
            chat_template_kwargs=result.chat_template_kwargs,
            where=row.where,
            images=placed,
        )
    if summary.prompts:
        return
    if not summary.read:
        raise InputError(f"{path}: no prompts in the file")
    first = summary.first_dropped
    if summary.refused:
        kind = max(summary.refused, key=lambda k: summary.refused[k])
        first = summary.first_refused[kind]
    elif summary.skipped_lines and not first:
        first = f"{path}:{summary.skipped_lines[0][0]}: {summary.skipped_lines[0][1]}"
    skipped = f", {summary.skipped:,} bad lines skipped" if summary.skipped else ""
    raise InputError(
        f"{path}: no prompts to send: {summary.read:,} rows read, {summary.refused_rows:,} "
        f"refused, {summary.dropped:,} dropped{skipped}; e.g. {first}"
    )


def iter_prompts(
    path: Path,
    limit: int | None = None,
    split: str | None = None,
    skip_bad_lines: bool = False,
    images: ImageIntake | None = None,
) -> Iterator[Prompt]:
    """The prompts of a file in order, each normalised, at most `limit` of them.

    Raises an InputError naming the file and row when the file cannot be read, an id repeats,
    or no prompt is left (a `datasets_in.BadLine` for a JSONL line that is not a JSON object,
    unless `skip_bad_lines`); rows that are refused, dropped or skipped are left out
    (`summarise_prompts` counts them). `images` says how images are read (default: relative to
    the file's folder, URLs not fetched, any profile).
    """
    return _read(path, limit, split, PromptSummary(path), skip_bad_lines, images)


def summarise_prompts(
    path: Path,
    limit: int | None = None,
    split: str | None = None,
    skip_bad_lines: bool = False,
    images: ImageIntake | None = None,
) -> PromptSummary:
    """Read the whole prompts file once, before any request: what it holds, and the ids in order."""
    summary = PromptSummary(path)
    for _ in _read(path, limit, split, summary, skip_bad_lines, images):
        pass
    return summary


def scan_prompts(path: Path, limit: int | None = None, split: str | None = None) -> list[str]:
    """Validate the prompts file before any request; return the prompt keys in order."""
    return summarise_prompts(path, limit, split).keys


def load_prompts(
    path: Path, split: str | None = None, summary: PromptSummary | None = None
) -> dict[str, dict[str, Any]]:
    """The prompts file as sources by id (see `Prompt.source`), for TPL001's `--prompts`;
    what was read is counted in `summary` when one is given."""
    summary = summary if summary is not None else PromptSummary(path)
    return {prompt.key: prompt.source() for prompt in _read(path, None, split, summary)}
