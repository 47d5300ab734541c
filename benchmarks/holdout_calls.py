"""Corruptions inside tool calls, as a judge of the call grammar would make them.

Each works on the answer of a record that holds calls (the ids after the response token, or the
whole output where the prompt closed the reasoning): drafts of calls inside the reasoning are
left alone, since a draft is not a call. Text-level ones decode the answer, change it, and
encode it again with special-token strings recognised (the markers come back as their ids);
id-level ones move the marker ids themselves. Every one must give the record a finding at
error severity (`benchmarks/holdout.py` judges them with the rest):

* a closing tag written as text (`</parameter>`, `</arg_value>`, `</invoke>`, DSML's
  `</｜DSML｜parameter>`, ...) lost, or written twice;
* text left between two tags or two call markers, where the template writes only whitespace;
* an object or array argument written as a Python literal (`{'a': 1}`, `['x', True]`);
* an id outside the vocabulary inside the calls;
* a call's begin and end markers in reverse order.
"""

from __future__ import annotations

import json
import re
from typing import Any

from fixtures.family_partitions import Builder, Draft

# A closing tag of the calls written as text (not one inside an argument's value, like `</b>`).
_NAMES = r"[^<>\n]{0,20}(?:parameter|arg_|invoke|function|tool|DSML|minimax)"
_TAG = rf"</{_NAMES}[^<>\n]{{0,20}}>"
_CLOSER = re.compile(_TAG)
# A closer followed, after whitespace only, by another tag of the calls (not the end of turn):
# the place for text left over.
_BETWEEN_TAGS = re.compile(rf"{_TAG}(?=\s*</?{_NAMES})")


def _answer_start(b: Builder, d: Draft) -> int:
    """Where the answer starts in the output: after the last response token, else at 0."""
    end = b.profile.think_end
    if end is not None and end in d.output_ids:
        return len(d.output_ids) - d.output_ids[::-1].index(end)
    if d.reasoning in ("prompt_opens", "model_opens"):
        raise ValueError("no answer to change: the reasoning never closes")
    return 0


def _calls_in(b: Builder, answer: list[int]) -> None:
    """Raise unless the answer holds a call (a marker id, or a marker's text)."""
    markers = set(b.profile.tool_markers.values())
    if markers and markers & set(answer):
        return
    texts = b.profile.tool_text_markers.values()
    if texts and any(t in b.tokenizer.decode_batch([answer])[0] for t in texts):
        return
    raise ValueError("the answer holds no call")


def _edit_answer_text(b: Builder, d: Draft, edit: Any) -> None:
    """The answer decoded, `edit`ed (text -> text, or raise ValueError), and encoded again."""
    if b.profile.channels is not None:
        raise ValueError("harmony calls are the channel rules'")
    start = _answer_start(b, d)
    answer = d.output_ids[start:]
    _calls_in(b, answer)
    text = b.tokenizer.decode_batch([answer])[0]
    changed = edit(text)
    if changed == text:
        raise ValueError("nothing changed")
    d.output_ids = d.output_ids[:start] + b.tokenizer.encode_text(changed)
    d.finish = {"type": "stop", "matched": d.output_ids[-1]}


def _edit_a_closer(b: Builder, d: Draft, times: int) -> None:
    """One closing tag of the calls, chosen at random, written `times` times (0: lost)."""
    def edit(text: str) -> str:
        found = list(_CLOSER.finditer(text))
        if not found:
            raise ValueError("no closing tag written as text")
        hit = b.rng.choice(found)
        return text[: hit.start()] + hit.group() * times + text[hit.end() :]
    _edit_answer_text(b, d, edit)


def closer_missing(b: Builder, d: Draft) -> None:
    """One closing tag of the calls lost."""
    _edit_a_closer(b, d, 0)


def closer_repeated(b: Builder, d: Draft) -> None:
    """One closing tag of the calls written twice."""
    _edit_a_closer(b, d, 2)


def text_between_tags(b: Builder, d: Draft) -> None:
    """Text left between a closing tag and the next tag, or between a call's end marker id and
    what follows it inside the calls (either, where the family has both)."""
    markers = b.profile.tool_markers
    start, stops = _answer_start(b, d), set(b.profile.stop_ids)
    places = [i + 1 for i in range(start, len(d.output_ids) - 1)
              if d.output_ids[i] == markers.get("call_end") and d.output_ids[i + 1] not in stops]
    text = b.tokenizer.decode_batch([d.output_ids[start:]])[0]
    tags = bool(_BETWEEN_TAGS.search(text)) and b.profile.channels is None
    if places and (not tags or b.rng.random() < 0.5):
        at = b.rng.choice(places)
        d.output_ids[at:at] = b.tokenizer.encode_text(" Let me check. ")
        return

    def edit(text: str) -> str:
        found = list(_BETWEEN_TAGS.finditer(text))
        if not found:
            raise ValueError("no two tags in a row, no call end followed inside the calls")
        hit = b.rng.choice(found)
        return text[: hit.end()] + " Let me check. " + text[hit.end() :]
    _edit_answer_text(b, d, edit)


def _json_values(text: str) -> list[tuple[int, int, Any]]:
    """Every JSON object or array that starts at a `{` or `[` of `text`: (start, end, value)."""
    decoder = json.JSONDecoder()
    found = []
    for match in re.finditer(r"[\[{]", text):
        try:
            value, end = decoder.raw_decode(text, match.start())
        except ValueError:
            continue
        if isinstance(value, dict | list) and value:
            found.append((match.start(), end, value))
    return found


def _python_literal(value: Any) -> str | None:
    """`value` as Python writes it, when that is not JSON too."""
    written = repr(value)
    try:
        json.loads(written)
    except ValueError:
        return written
    return None


def argument_python_literal(b: Builder, d: Draft) -> None:
    """An object or array argument written as a Python literal (a pipeline that `str()`s it)."""
    def edit(text: str) -> str:
        options = [(a, z, w) for a, z, v in _json_values(text) if (w := _python_literal(v)) is not None]
        if not options:
            raise ValueError("no object or array argument that Python writes otherwise")
        start, end, written = b.rng.choice(options)
        return text[:start] + written + text[end:]
    _edit_answer_text(b, d, edit)


def id_outside_vocabulary_in_call(b: Builder, d: Draft) -> None:
    """An id the tokenizer lacks, placed just after one of the calls' marker ids."""
    start = _answer_start(b, d)
    markers = set(b.profile.tool_markers.values())
    places = [i + 1 for i in range(start, len(d.output_ids)) if d.output_ids[i] in markers]
    if not places:
        raise ValueError("no call marker id")
    d.output_ids.insert(b.rng.choice(places), b.tokenizer.vocab_size + 11)


def call_markers_reversed(b: Builder, d: Draft) -> None:
    """A call's begin and end marker ids swapped."""
    markers = b.profile.tool_markers
    if "call_begin" not in markers or "call_end" not in markers:
        raise ValueError("the calls have no begin and end marker ids")
    start = _answer_start(b, d)
    ids = d.output_ids
    try:
        begin = ids.index(markers["call_begin"], start)
        end = ids.index(markers["call_end"], begin)
    except ValueError as error:
        raise ValueError("no whole call") from error
    ids[begin], ids[end] = ids[end], ids[begin]
