"""A record's view as lines of rich text: the detail pane of the viewer and `--print` output.

`DetailLines` is lazy: it knows how many lines a record takes and renders any one of them on
request, so the viewer draws only the rows on screen, even for outputs of tens of thousands
of tokens. `--print` walks every line. Where the view leaves tokens out (a long record's
windows, `audit.flows.token_window`), one line says how many, and the header how to see them.
"""

from __future__ import annotations

import io
from bisect import bisect_right
from collections.abc import Iterator
from dataclasses import dataclass

import polars as pl
from rich.console import Console
from rich.text import Text

from audit.base.inert import CELL_LIMIT, terminal
from audit.flows.token_view import RecordView
from audit.flows.token_window import ROLE_UNKNOWN, TokenRun
from audit.records.segments import (
    ROLE_END_OF_TURN,
    ROLE_EOS,
    ROLE_IMAGE,
    ROLE_RESPONSE,
    ROLE_SPECIAL,
    ROLE_THINK,
    ROLE_TOOL,
    SEGMENT_ANSWER,
    SEGMENT_PROMPT,
    SEGMENT_REASONING,
    SEGMENT_TOOL_CALLS,
)

ROLE_STYLE = {
    ROLE_THINK: "bold magenta",
    ROLE_RESPONSE: "bold bright_green",
    ROLE_END_OF_TURN: "bold bright_blue",
    ROLE_EOS: "bold cyan",
    ROLE_TOOL: "bold yellow",
    ROLE_SPECIAL: "cyan",
    ROLE_UNKNOWN: "bold white on red",
    ROLE_IMAGE: "bold black on bright_cyan",
}
ROLE_LABEL = {
    ROLE_THINK: "think",
    ROLE_RESPONSE: "response",
    ROLE_END_OF_TURN: "end of turn",
    ROLE_EOS: "eos",
    ROLE_TOOL: "tool marker",
    ROLE_SPECIAL: "special",
    ROLE_UNKNOWN: "not in vocabulary",
    ROLE_IMAGE: "image",
}
SEGMENT_STYLE = {
    SEGMENT_PROMPT: "grey50",
    SEGMENT_REASONING: "magenta",
    SEGMENT_ANSWER: "green",
    SEGMENT_TOOL_CALLS: "yellow",
}
SEVERITY_STYLE = {"error": "bold red", "warning": "bold yellow"}
# How to see every token, as `--print` says it (the viewer has a key for it).
ALL_TOKENS_HINT = "--all-tokens shows every token"
FINDING_STYLE = "bold white on dark_red"
# How many of the output's special tokens the summary line names before "+N more".
SUMMARY_SPECIALS = 14
# Wraps lines to a width (rich needs a console to measure with; nothing is printed on it).
_MEASURE = Console(file=io.StringIO(), width=1000, color_system=None)


def role_style(role: str | None) -> str:
    """The colour of a token's role; tool markers share one."""
    if role is None:
        return ""
    return ROLE_STYLE.get(role.split(":", 1)[0], "")


def shown_piece(piece: str) -> str:
    """A decoded piece with its whitespace made visible, one line (other controls as \\xNN)."""
    return terminal(
        piece.replace("\\", "\\\\")
        .replace("\n", "\\n")
        .replace("\r", "\\r")
        .replace("\t", "\\t")
        .replace(" ", "␣")
    )


@dataclass(frozen=True)
class _TokenBlock:
    """Rows of one segment of a token run: a heading line, then one line per token."""

    heading: Text
    tokens: pl.DataFrame
    messages: dict[tuple[str, int], str]  # (rule, position) -> message, for the marked rows

    def __len__(self) -> int:
        return 1 + self.tokens.height

    def line(self, offset: int) -> Text:
        if offset == 0:
            return self.heading
        index, token_id, piece, role, segment, rules = self.tokens.row(offset - 1)
        text = Text(no_wrap=True, end="")
        text.append("▌ ", style=SEGMENT_STYLE.get(segment, ""))
        text.append(f"{index:>7} ", style="dim")
        text.append(f"{token_id:>7}  ")
        # An image's chip is text of the audit's own (escaped: it names the image_data entry).
        shown = terminal(piece) if role == ROLE_IMAGE else shown_piece(piece)
        # Pad only when a role or a finding follows, so printed rows carry no trailing blanks.
        text.append(f"{shown:<28}" if role is not None or rules else shown, style=role_style(role) or None)
        if role is not None:
            label = ROLE_LABEL.get(role.split(":", 1)[0], role)
            if role.startswith(f"{ROLE_TOOL}:"):
                label = f"tool {role.split(':', 1)[1].replace('_', ' ')}"
            text.append(f" {label}", style=role_style(role))
        if rules:
            for rule in rules.split(","):
                text.append("  ◀ ", style="bold red")
                text.append(f" {rule} ", style=FINDING_STYLE)
                text.append(f" {terminal(self.messages.get((rule, index), ''))}", style="red")
        return text


class DetailLines:
    """Every line of a record's detail, rendered one at a time on request."""

    def __init__(
        self, view: RecordView, title: str = "", width: int | None = None, all_tokens_hint: str = ALL_TOKENS_HINT
    ):
        """`width`: the pane's, to wrap the findings and comparisons at (None: the caller wraps,
        as a terminal does for `--print`); `all_tokens_hint`: how to see the tokens a long
        record's view leaves out."""
        self.view = view
        self.title = title
        self.all_tokens_hint = all_tokens_hint
        self._blocks: list[list[Text] | _TokenBlock] = [_header(view, title, width, all_tokens_hint)]
        self._blocks.extend(_token_blocks(view, view.prompt, "prompt"))
        self._blocks.extend(_token_blocks(view, view.output, "output"))
        self._starts: list[int] = []
        total = 0
        for block in self._blocks:
            self._starts.append(total)
            total += len(block)
        self._length = total
        # Token rows with a finding message run long; the pane scrolls sideways that far.
        header = self._blocks[0]
        assert isinstance(header, list)  # the header block, built above
        self.width = max(200, *(t.cell_len for t in header))

    def __len__(self) -> int:
        return self._length

    def line(self, y: int) -> Text:
        """Line `y` (0-based) of the detail."""
        which = bisect_right(self._starts, y) - 1
        block = self._blocks[which]
        offset = y - self._starts[which]
        return block[offset] if isinstance(block, list) else block.line(offset)

    def __iter__(self) -> Iterator[Text]:
        for block in self._blocks:
            if isinstance(block, list):
                yield from block
            else:
                for offset in range(len(block)):
                    yield block.line(offset)

    def first_finding_lines(self) -> list[int]:
        """Detail lines of the tokens that findings point at, in order (for jumping to them)."""
        found: list[int] = []
        for start, block in zip(self._starts, self._blocks, strict=True):
            if isinstance(block, _TokenBlock):
                rows = block.tokens["rules"].is_not_null().arg_true()
                found.extend(start + 1 + int(row) for row in rows)
        return found


def _wrapped(text: Text, width: int | None, indent: int) -> list[Text]:
    """`text` as lines of at most `width` cells, continuation lines indented, styles kept: a
    finding's message, a heading or the legend is read whole, never cut at the pane's edge."""
    if width is None or text.cell_len <= width:
        return [text]
    width = max(20, width)
    first = text.wrap(_MEASURE, width, overflow="fold", no_wrap=False)[0]
    # The rest of the text (the first line is a prefix of it), indented, wrapped again at the
    # width less its indent.
    cut = len(first.plain.rstrip())
    cut += len(text.plain[cut:]) - len(text.plain[cut:].lstrip())
    first = text.divide([cut])[0]
    first.rstrip()
    out = [first]
    rest = text.divide([cut])[1]
    for line in rest.wrap(_MEASURE, width - indent, overflow="fold", no_wrap=False):
        shifted = Text(" " * indent, end="")
        shifted.append_text(line)
        out.append(shifted)
    for line in out:
        line.end = ""
        line.no_wrap = True
    return out


def _header(view: RecordView, title: str, width: int | None = None, hint: str = ALL_TOKENS_HINT) -> list[Text]:
    lines: list[Text] = []
    heading = Text(no_wrap=True, end="")
    if title:
        heading.append(f"{terminal(title, CELL_LIMIT)}  ", style="dim")
    heading.append(f"line {view.line}", style="bold")
    heading.append("  ·  id ", style="dim")
    heading.append(terminal(view.id, CELL_LIMIT) if view.id is not None else "(none)", style="bold")
    if view.finish_reason:
        heading.append(f"  ·  finish {terminal(view.finish_reason, CELL_LIMIT)}", style="dim")
    heading.append(f"  ·  prompt {view.prompt.total}, output {view.output.total} tokens", style="dim")
    lines.extend(_wrapped(heading, width, indent=4))
    if view.windowed:
        lines.extend(_wrapped(_window_note(view, hint), width, indent=4))
    for summary in _special_summary(view):
        lines.extend(_wrapped(summary, width, indent=4))
    for mark in view.findings:
        text = Text(no_wrap=True, end="")
        text.append(f" {mark.rule} ", style=FINDING_STYLE if mark.severity == "error" else "bold black on yellow")
        text.append(f" {mark.severity:<7} ", style=SEVERITY_STYLE.get(mark.severity, ""))
        where = f"{mark.field}[{mark.position}]" if mark.position is not None else (mark.field or "line")
        text.append(f"{terminal(where):<18} ", style="dim")
        text.append(terminal(mark.message))
        lines.extend(_wrapped(text, width, indent=4))
    if not view.findings:
        lines.append(Text("no findings on this line", style="green", end=""))
    if view.problem:
        problem = f"cannot show every token: {terminal(view.problem)}"
        lines.extend(_wrapped(Text(problem, style="bold red", end=""), width, indent=4))
    if view.raw_excerpt:
        raw = Text(f"raw line: {view.raw_excerpt}", style="dim", end="")
        lines.extend(_wrapped(raw, width, indent=4))
    for comparison in view.comparisons:
        lines.append(Text(f"{comparison.rule}  {comparison.title}", style="bold", end=""))
        for label, value in comparison.rows:
            row = Text(no_wrap=True, end="")
            row.append(f"  {label:>12}  ", style="green" if label == "expected" else "dim")
            row.append(terminal(value))
            lines.extend(_wrapped(row, width, indent=16))
    lines.extend(_wrapped(_legend(), width, indent=4))
    return lines


def _window_note(view: RecordView, hint: str) -> Text:
    """One line: how much of a long record the view leaves out, and how to see it."""
    parts = [
        f"{run.omitted:,} of {run.total:,} {name} tokens"
        for name, run in (("output", view.output), ("prompt", view.prompt))
        if run.omitted
    ]
    text = Text(no_wrap=True, end="")
    text.append("left out: ", style="bold yellow")
    text.append(
        f"{' and '.join(parts)} (shown: the output's first and last tokens, the prompt's tail and "
        f"each finding's window); {hint}"
    )
    return text


def _special_summary(view: RecordView) -> list[Text]:
    """Where the special tokens are, by role colour: the output's, then the prompt tail's."""
    lines = []
    for label, run, limit in (("output", view.output, SUMMARY_SPECIALS), ("prompt end", view.prompt, 4)):
        text = Text(no_wrap=True, end="")
        text.append(f"special tokens, {label}: ", style="bold")
        # The output's over the whole of it, those left out of a long record's view too.
        specials = view.special_tokens if run.field == "output_ids" else run.tokens.filter(pl.col("role").is_not_null())
        # The prompt's last special tokens are its generation suffix; the output's first matter most.
        shown = specials.tail(limit) if run.field == "input_ids" else specials.head(limit)
        if shown.is_empty():
            text.append("none", style="dim")
        for index, piece, role in shown.select("index", "piece", "role").iter_rows():
            text.append(shown_piece(piece) or "?", style=role_style(role))
            text.append(f"@{index} ", style="dim")
        if specials.height > limit and run.field == "output_ids":
            text.append(f"+{specials.height - limit} more", style="dim")
        lines.append(text)
    return lines


def _legend() -> Text:
    text = Text(no_wrap=True, end="")
    text.append("roles: ", style="dim")
    for role in (ROLE_THINK, ROLE_RESPONSE, ROLE_TOOL, ROLE_END_OF_TURN, ROLE_EOS, ROLE_SPECIAL, ROLE_UNKNOWN):
        text.append(ROLE_LABEL[role], style=ROLE_STYLE[role])
        text.append("  ")
    text.append("segments: ", style="dim")
    for segment, style in SEGMENT_STYLE.items():
        text.append("▌", style=style)
        text.append(f"{segment.replace('_', ' ')} ", style="dim")
    return text


def _token_blocks(view: RecordView, run: TokenRun, name: str) -> list[_TokenBlock | list[Text]]:
    """A run split where its segment changes, each part under its own heading, and a line
    wherever the view leaves tokens out between the parts."""
    messages = {
        (m.rule, m.position): m.message for m in view.findings if m.field == run.field and m.position is not None
    }
    if run.height == 0:
        heading = Text(f"── {name}: {run.field} is empty or unreadable ──", style="bold", end="")
        return [_TokenBlock(heading, run.tokens, messages)]
    segments, indexes = run.tokens["segment"], run.tokens["index"]
    jumps = (indexes.diff() != 1).fill_null(True)
    starts = ((segments != segments.shift(1)).fill_null(True) | jumps).arg_true().to_list()
    blocks: list[_TokenBlock | list[Text]] = []
    for first, after in zip(starts, [*starts[1:], run.height], strict=True):
        part = run.tokens.slice(first, after - first)
        segment = part["segment"][0]
        lo, hi = int(indexes[first]), int(indexes[after - 1]) + 1
        if first and jumps[first]:
            blocks.append([_gap_line(run.field, int(indexes[first - 1]) + 1, lo)])
        if name == "prompt":
            title = f"── {'prompt tail' if hi == run.total and lo > 0 else 'prompt'}: {run.field}[{lo}:{hi}] of {run.total} "
        else:
            title = f"── {name} · {segment.replace('_', ' ')}: {run.field}[{lo}:{hi}] of {run.total} "
        heading = Text(title + "─" * 20, style=f"bold {SEGMENT_STYLE.get(segment, '')}", end="", no_wrap=True)
        blocks.append(_TokenBlock(heading, part, messages))
    last = int(indexes[-1]) + 1
    if last < run.total:
        blocks.append([_gap_line(run.field, last, run.total)])
    return blocks


def _gap_line(field: str, lo: int, hi: int) -> Text:
    """The line that stands for the tokens `field[lo:hi]` the view leaves out."""
    return Text(f"   ··· {hi - lo:,} tokens left out: {field}[{lo}:{hi}] ···", style="dim yellow", end="", no_wrap=True)
