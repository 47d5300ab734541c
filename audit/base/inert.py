"""Untrusted text made inert for the place it is shown.

Everything read from data files, saved reports, lock files and servers is untrusted: ids,
messages, targets, rule names, paths. Each output has its own way for such text to turn into
something else (a terminal escape sequence, rich markup, an XML document that no longer
parses, a second GitHub workflow command, a markdown link), so each has one function here,
and every writer passes data through it. HTML pages escape with `html.escape` (audit.report.html).

    terminal(text)         control, bidi and lone-surrogate characters shown as \\xNN / \\uNNNN
    xml(text)              the same for characters XML 1.0 forbids; the rest is ElementTree's job
    github_data(text)      a workflow command's message: one line, %, CR and LF encoded
    github_property(text)  a workflow command's property value: also ':' and ','
    markdown(text)         a markdown table cell: one line, no markup, no HTML, no '|'

Rich markup is handled where rich is used (`audit.cli.tables.plain`): data goes into `Text`
objects, which are never parsed as markup.
"""

from __future__ import annotations

import re

# C0 and C1 controls and DEL (ESC starts ANSI and OSC sequences, CR overwrites a line), the
# bidirectional overrides and isolates that reorder what a reader sees (U+061C, U+200E/F,
# U+202A-E, U+2066-9), the line and paragraph separators, and lone surrogates (they cannot be
# encoded, so printing one would crash the writer).
_TERMINAL_UNSAFE = re.compile(
    "[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069\ud800-\udfff]"
)
# What XML 1.0 does not allow in a document at all (tab, LF and CR are allowed).
_XML_UNSAFE = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")
# What makes a table cell a link, an image, HTML, code or a new cell (and the escape itself).
_MARKDOWN_SPECIAL = re.compile(r"([\\`\[\]<|])")
# Table cells and error lines show at most this many characters of one value.
CELL_LIMIT = 200


def _visible(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def shorten(text: str, limit: int | None) -> str:
    """`text` cut to `limit` characters, saying how long it was."""
    if limit is None or len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text):,} characters)"


def terminal(text: object, limit: int | None = None) -> str:
    """Text that prints as itself on a terminal: no escape sequence, no line break, no reordering.

    Controls show as `\\x1b`, `\\x0d`, ...; bidi controls and lone surrogates as `\\u202e`.
    With `limit`, text longer than that is cut and says so.
    """
    return _TERMINAL_UNSAFE.sub(_visible, shorten(str(text), limit))


def xml(text: object) -> str:
    """Text that an XML 1.0 document can hold (ElementTree escapes `<`, `&` and quotes)."""
    return _XML_UNSAFE.sub(_visible, str(text))


def github_data(text: object) -> str:
    """The message of a GitHub workflow command: one line that cannot start another command."""
    visible = terminal(text)  # CR and LF included: the command is one line whatever the data
    return visible.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def github_property(text: object) -> str:
    """A property value of a GitHub workflow command (`file=`, `title=`): also `:` and `,`."""
    return github_data(text).replace(":", "%3A").replace(",", "%2C")


def markdown(text: object) -> str:
    """A markdown table cell: data is never a link, an image, HTML, code or another cell."""
    return _MARKDOWN_SPECIAL.sub(r"\\\1", terminal(text))
