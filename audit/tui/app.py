"""The interactive viewer of `audit inspect`: a list of records with findings, and a detail pane.

The detail pane is a line-API `ScrollView`: it asks `DetailLines` for the rows on screen only,
so an output of tens of thousands of tokens scrolls as fast as a short one. A long record is
shown as `--print` shows it, the windows around its findings; `a` shows every token of it.
"""

from __future__ import annotations

from rich.text import Text
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.geometry import Size
from textual.screen import ModalScreen
from textual.scroll_view import ScrollView
from textual.strip import Strip
from textual.widgets import Footer, Input, OptionList, Static
from textual.widgets.option_list import Option

from audit.base.inert import CELL_LIMIT, terminal
from audit.flows.token_view import Inspector, RecordEntry
from audit.tui.detail import SEVERITY_STYLE, DetailLines

# How to see every token of a long record, as the viewer says it.
ALL_TOKENS_KEY = "press a to show every token"

HELP = """\
audit inspect: the records with findings, token by token

  n / p        next / previous record in the list
  ↑ ↓ PgUp PgDn Home End   scroll the tokens (or move in the list when it has focus)
  f            jump to the next token a finding points at
  a            every token of a long record, or back to the windows around its findings
  /            filter the list by id, line or rule code (Enter applies, Esc cancels)
  r            cycle the rule filter through the rules with findings
  g            go to a line of the file (any line, with findings or not)
  tab          move focus between the list and the tokens
  ?            this help (Esc closes it)
  q            quit

Each token row: segment bar, index in its id list, id, decoded piece (␣ is a space, \\n a
newline), role of a special token, and ◀ RULE message where a finding points.
Segments: grey prompt, magenta reasoning, green answer, yellow tool calls.
"""


class DetailView(ScrollView, can_focus=True):
    """A record's detail, rendered line by line as it scrolls into view."""

    DEFAULT_CSS = """
    DetailView { width: 1fr; height: 1fr; }
    """

    BINDINGS = [
        Binding("up", "scroll_up", "Up", show=False),
        Binding("down", "scroll_down", "Down", show=False),
        Binding("pageup", "page_up", "Page up", show=False),
        Binding("pagedown", "page_down", "Page down", show=False),
        Binding("space", "page_down", "Page down", show=False),
        Binding("home", "scroll_home", "Top", show=False),
        Binding("end", "scroll_end", "Bottom", show=False),
        Binding("left", "scroll_left", "Left", show=False),
        Binding("right", "scroll_right", "Right", show=False),
    ]

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.lines: DetailLines | None = None
        self._message: Text = Text("")

    def show(self, lines: DetailLines) -> None:
        """Show a record from the top."""
        self.lines = lines
        self.virtual_size = Size(lines.width, len(lines))
        self.scroll_to(0, 0, animate=False)
        self.refresh()

    def wrap_width(self) -> int | None:
        """The width findings wrap at: the pane's, less its scroll bar (None before layout)."""
        return self.size.width - 2 if self.size.width > 2 else None

    def on_resize(self) -> None:
        # Findings wrap to the pane: a new width, a new layout of the same record.
        if self.lines is not None:
            y = self.scroll_offset.y
            self.lines = DetailLines(
                self.lines.view, self.lines.title, width=self.wrap_width(), all_tokens_hint=self.lines.all_tokens_hint
            )
            self.virtual_size = Size(self.lines.width, len(self.lines))
            self.scroll_to(0, y, animate=False)
            self.refresh()

    def show_message(self, message: str) -> None:
        """Show a line of text instead of a record (an empty list, say)."""
        self.lines = None
        self._message = Text(terminal(message), style="yellow")
        self.virtual_size = Size(len(message), 1)
        self.scroll_to(0, 0, animate=False)
        self.refresh()

    def jump_to_next_finding(self) -> bool:
        """Scroll so the next token a finding points at is near the top; False if none is below."""
        if self.lines is None:
            return False
        top = round(self.scroll_offset.y)
        targets = self.lines.first_finding_lines()
        after = [y for y in targets if y > top + 2]
        target = after[0] if after else (targets[0] if targets else None)
        if target is None:
            return False
        self.scroll_to(y=max(0, target - 2), animate=False)
        return True

    def render_line(self, y: int) -> Strip:
        scroll_x, scroll_y = self.scroll_offset
        row = y + scroll_y
        width = self.size.width
        if self.lines is None:
            text = self._message if row == 0 else None
        else:
            text = self.lines.line(row) if row < len(self.lines) else None
        if text is None:
            return Strip.blank(width, self.rich_style)
        strip = Strip(list(text.render(self.app.console, end="")))
        return strip.crop_extend(scroll_x, scroll_x + width, self.rich_style)


class HelpScreen(ModalScreen[None]):
    """The keys, over the viewer."""

    BINDINGS = [
        Binding("escape", "dismiss", "Close"),
        Binding("question_mark", "dismiss", "Close"),
        Binding("q", "app.quit", "Quit"),
    ]
    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > Static { width: auto; max-width: 96; padding: 1 2; border: round $accent; background: $surface; }
    """

    def compose(self) -> ComposeResult:
        yield Static(HELP)


class InspectApp(App[None]):
    """Browse the records with findings; look at each one token by token."""

    TITLE = "audit inspect"
    # The keys are the viewer's commands: no palette, whose entry in the footer pushed "help"
    # and "quit" off an 80-column terminal.
    ENABLE_COMMAND_PALETTE = False
    CSS = """
    #status { height: 1; padding: 0 1; background: $boost; }
    #records { width: 38; height: 1fr; border: none; }
    #ask { dock: bottom; display: none; }
    #ask.asking { display: block; }
    """
    BINDINGS = [
        Binding("n", "move(1)", "next"),
        Binding("p", "move(-1)", "previous"),
        Binding("f", "next_finding", "finding"),
        # Off the footer (full at 80 columns): a long record's note says to press it; so does `?`.
        Binding("a", "all_tokens", "all tokens", show=False),
        Binding("slash", "ask('filter')", "filter"),
        Binding("r", "cycle_rule", "rule"),
        Binding("g", "ask('line')", "go to line"),
        Binding("question_mark", "help", "help"),
        Binding("q", "quit", "quit"),
        Binding("escape", "cancel_ask", "cancel", show=False),
    ]

    def __init__(
        self,
        inspector: Inspector,
        *,
        title: str = "",
        rule: str | None = None,
        start_line: int | None = None,
    ):
        super().__init__()
        self.inspector = inspector
        self.target = title
        self.rule = rule
        self.query_text = ""
        self.entries: list[RecordEntry] = []
        self.current_line: int | None = None
        self._start_line = start_line
        self._asking: str | None = None
        self.all_tokens = inspector.all_tokens

    # -- layout ---------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield Static(id="status")
        with Horizontal():
            yield OptionList(id="records")
            yield DetailView(id="detail")
        yield Input(id="ask")
        yield Footer()

    def on_mount(self) -> None:
        self._refill(keep=self._start_line)
        if self._start_line is not None and self.current_line != self._start_line:
            self.show_line(self._start_line)
        self.query_one(DetailView).focus()

    # -- the list -------------------------------------------------------------------------
    def _refill(self, keep: int | None = None) -> None:
        """Rebuild the list for the current filters, keeping `keep`'s record selected if listed."""
        self.entries = self.inspector.select(self.rule, self.query_text)
        records = self.query_one("#records", OptionList)
        records.clear_options()
        records.add_options([Option(_entry_label(e), id=str(e.line)) for e in self.entries])
        self._update_status()
        if not self.entries:
            self.current_line = None
            self.query_one(DetailView).show_message(
                f"no record matches: rule {self.rule or 'any'}, filter {self.query_text!r}  "
                "(r cycles the rule, / changes the filter)"
            )
            return
        lines = [e.line for e in self.entries]
        index = lines.index(keep) if keep in lines else 0
        records.highlighted = index
        self.show_line(lines[index])

    def on_option_list_option_highlighted(self, event: OptionList.OptionHighlighted) -> None:
        if event.option.id is not None and int(event.option.id) != self.current_line:
            self.show_line(int(event.option.id))

    def show_line(self, line: int) -> None:
        """Show the record on `line` in the detail pane."""
        try:
            view = self.inspector.view(line, all_tokens=self.all_tokens)
        except IndexError:
            self.notify(
                f"line {line} is not in the file ({self.inspector.lines} lines)",
                severity="error",
                markup=False,
            )
            return
        self.current_line = line
        detail = self.query_one(DetailView)
        detail.show(DetailLines(view, width=detail.wrap_width(), all_tokens_hint=ALL_TOKENS_KEY))
        self._update_status()

    def _update_status(self) -> None:
        position = ""
        lines = [e.line for e in self.entries]
        if self.current_line in lines:
            position = f"record {lines.index(self.current_line) + 1} of {len(lines)}"
        elif self.current_line is not None:
            position = f"line {self.current_line} (not in the list)"
        text = Text(no_wrap=True)
        text.append(f"{terminal(self.target, CELL_LIMIT)}  ", style="bold")
        text.append(f"{len(self.inspector.entries)} records with findings  ·  ")
        text.append(f"rule {self.rule or 'any'}", style="bold yellow" if self.rule else "")
        if self.query_text:
            text.append(f"  ·  filter {self.query_text!r}", style="bold yellow")
        text.append(f"  ·  {position}" if position else "")
        text.append("   ? help", style="dim")
        self.query_one("#status", Static).update(text)

    # -- actions --------------------------------------------------------------------------
    def action_move(self, step: int) -> None:
        if not self.entries:
            return
        lines = [e.line for e in self.entries]
        if self.current_line in lines:
            index = max(0, min(len(lines) - 1, lines.index(self.current_line) + step))
        else:
            # Off the list (after `g`): step to the neighbour of that line in file order.
            later = [i for i, line in enumerate(lines) if (line > (self.current_line or 0)) == (step > 0)]
            index = (later[0] if step > 0 else later[-1]) if later else (0 if step > 0 else len(lines) - 1)
        records = self.query_one("#records", OptionList)
        records.highlighted = index
        if lines[index] != self.current_line:
            self.show_line(lines[index])

    def action_cycle_rule(self) -> None:
        cycle: list[str | None] = [None, *self.inspector.rules]
        self.rule = cycle[(cycle.index(self.rule) + 1) % len(cycle)] if self.rule in cycle else None
        self._refill(keep=self.current_line)

    def action_next_finding(self) -> None:
        if not self.query_one(DetailView).jump_to_next_finding():
            self.notify("no finding of this record points at a token")

    def action_all_tokens(self) -> None:
        self.all_tokens = not self.all_tokens
        if self.current_line is not None:
            self.show_line(self.current_line)
        self.notify("every token of each record" if self.all_tokens else "long records: the windows around their findings")

    def action_help(self) -> None:
        self.push_screen(HelpScreen())

    def action_ask(self, what: str) -> None:
        ask = self.query_one("#ask", Input)
        self._asking = what
        ask.value = self.query_text if what == "filter" else ""
        ask.placeholder = (
            "filter by id, line or rule code; Enter applies, empty clears, Esc cancels"
            if what == "filter"
            else f"go to line (1-{self.inspector.lines}); Enter goes, Esc cancels"
        )
        ask.add_class("asking")
        ask.focus()

    def action_cancel_ask(self) -> None:
        if self._asking is not None:
            self._close_ask()

    def _close_ask(self) -> None:
        self._asking = None
        ask = self.query_one("#ask", Input)
        ask.remove_class("asking")
        self.query_one(DetailView).focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        what, value = self._asking, event.value.strip()
        self._close_ask()
        if what == "filter":
            self.query_text = value
            self._refill(keep=self.current_line)
        elif what == "line":
            if not value.isdigit() or int(value) < 1:
                self.notify(
                    f"not a line number: {terminal(repr(value))}", severity="error", markup=False
                )
                return
            line = int(value)
            lines = [e.line for e in self.entries]
            if line in lines:
                self.query_one("#records", OptionList).highlighted = lines.index(line)
            self.show_line(line)


def _entry_label(entry: RecordEntry) -> Text:
    text = Text(no_wrap=True, overflow="ellipsis")
    text.append(f"{entry.line:>6} ", style="dim")
    text.append(f"{terminal(entry.id or '-')[:16]:<16} ")
    # The list is narrow: the first rule, and how many more the detail shows.
    more = f" +{len(entry.rules) - 1}" if len(entry.rules) > 1 else ""
    text.append(entry.rules[0], style=SEVERITY_STYLE.get(entry.severity, ""))
    text.append(more, style="dim")
    return text
