"""Round trip: the ids are the tokenizer's own reading of their text, and agree with `text`."""

from __future__ import annotations

import re

import numpy as np
import polars as pl

from audit.checks.base import Explanation, RecordRule, empty_findings, findings_frame
from audit.model.tokens.flat_ids import differing_sequences
from audit.model.tokens.token_text import token_pieces
from audit.records.batch import Batch


def _first_difference(left: list[int] | str, right: list[int] | str) -> int:
    for index, (a, b) in enumerate(zip(left, right, strict=False)):
        if a != b:
            return index
    return min(len(left), len(right))


def _ids_with_pieces(ids: list[int], pieces: list[str]) -> str:
    return "  ".join(f"{i}:{piece!r}" for i, piece in zip(ids, pieces, strict=True))


def _folder(special_strings: tuple[str, ...]):
    """Text without special-token strings, whitespace folded: what no decode setting changes."""
    pattern = re.compile("|".join(re.escape(s) for s in special_strings)) if special_strings else None

    def fold(text: str) -> str:
        if pattern is not None:
            text = pattern.sub(" ", text)
        return " ".join(text.split())

    return fold


class RoundTrip(RecordRule):
    """Output ids that do not survive `encode(decode(output_ids))` with special tokens kept.

    What it checks:
        Decoding `output_ids` (special tokens kept) and encoding the text again (special
        tokens recognised, nothing added) gives back exactly `output_ids`. One batched
        decode and one batched encode per block of records.

    Why it matters:
        Ids that are not the tokenizer's canonical reading of their own text did not come
        from this tokenizer: they were re-tokenised with another one, spliced from pieces,
        or carry plain-text copies of special tokens. The drafter would learn token
        boundaries the target never produces.

    Example:
        "weather" saved as the byte pieces w e a t h e r instead of the single merged id.

    Fix:
        Save `output_ids` from `/generate`; never rebuild ids from text. Check that the audit
        uses the server's tokenizer.
    """

    code = "RTR001"
    name = "round-trip-mismatch"
    encodes_text = True

    def explain(self, batch: Batch, row: int, position: int | None) -> Explanation | None:
        """The decoded text around the first difference, with the saved and re-encoded ids."""
        if not batch.decodable[row]:
            return None
        tokenizer = batch.tokenizer
        ids = batch.records["output_ids"][row].to_list()
        if not ids:
            return None
        again = tokenizer.encode_text(tokenizer.decode_batch([ids])[0])
        at = position if position is not None else _first_difference(ids, again)
        window = slice(max(0, at - 4), at + 8)
        saved, fresh = ids[window], again[window]
        rows = (
            ("decoded", repr(tokenizer.decode_batch([saved])[0])),
            ("saved ids", _ids_with_pieces(saved, token_pieces(tokenizer, saved))),
            ("re-encoded", _ids_with_pieces(fresh, token_pieces(tokenizer, fresh))),
        )
        return Explanation(self.code, f"decode then encode, output_ids[{window.start}:{window.stop}]", rows)

    def find(self, batch: Batch) -> pl.DataFrame:
        rows = batch.decodable_rows
        if len(rows) == 0:
            return empty_findings()
        original = batch.decodable_output
        # One flat encode of the whole batch, compared with numpy: no per-token Python.
        again = batch.tokenizer.encode_flat(batch.decoded_texts)
        differs = differing_sequences(original, again)
        if not differs.any():
            return empty_findings()
        bad_rows, positions, messages = [], [], []
        for index in np.flatnonzero(differs).tolist():
            ids, encoded = original.sequence(index), again.sequence(index)
            at = _first_difference(ids, encoded)
            bad_rows.append(int(rows[index]))
            positions.append(at)
            messages.append(
                f"re-encoding the decoded output differs from output_ids[{at}]: "
                f"saved {ids[at:at + 4]}..., tokenizer gives {encoded[at:at + 4]}..."
            )
        return findings_frame(bad_rows, positions, messages)


class TextMismatch(RecordRule):
    """A saved `text` that is not the decoding of the saved `output_ids`.

    What it checks:
        When a record carries `text`, it equals `decode(output_ids)` under one of SGLang's
        documented settings: special tokens kept or skipped (`skip_special_tokens`), with or
        without the final stop token (`no_stop_trim`). Differences only in special-token
        strings and whitespace (`spaces_between_special_tokens`) are accepted.

    Why it matters:
        The server produced `text` and `output_ids` together. When they disagree, one of them
        was changed afterwards, and nobody can tell which one the model really produced.

    Example:
        text: "The answer is 5."   decode(output_ids): "The answer is 4."

    Fix:
        Save the server's response whole; if a step must edit outputs, drop `text` or
        regenerate it from the ids.
    """

    code = "RTR002"
    name = "text-mismatch"

    def explain(self, batch: Batch, row: int, position: int | None) -> Explanation | None:
        """The `text` field beside the decoding of the ids, from just before they differ."""
        text, decoded = batch.records["text"][row], batch.decoded_output[row]
        if text is None or decoded is None:
            return None
        at = _first_difference(text, decoded)
        start = max(0, at - 30)
        rows = (("text field", repr(text[start : at + 50])), ("decoded ids", repr(decoded[start : at + 50])))
        return Explanation(self.code, f"text vs decode(output_ids), from character {start}", rows)

    def find(self, batch: Batch) -> pl.DataFrame:
        suspect = (
            batch.records.select("text")
            .with_columns(batch.decoded_output.alias("decoded"))
            .with_row_index("row")
            .filter(
                pl.col("text").is_not_null()
                & pl.col("decoded").is_not_null()
                & (pl.col("text") != pl.col("decoded"))
            )
        )
        if suspect.is_empty():
            return empty_findings()
        texts = suspect["text"].to_list()
        # The suspects' ids as flat arrays, and without a final stop id (`no_stop_trim` off).
        output = batch.output_flat.take(suspect["row"].to_numpy())
        trimmed = output.without_last(output.ends_with(batch.profile.stop_ids))
        tokenizer = batch.tokenizer
        variants = (
            lambda which: tokenizer.decode_flat_skipping_special(output.take(which)),  # SGLang's default
            lambda which: tokenizer.decode_flat(trimmed.take(which)),
            lambda which: tokenizer.decode_flat_skipping_special(trimmed.take(which)),
        )
        # Each setting decodes only the suspects no earlier setting explained.
        unexplained = np.arange(len(texts))
        for decode in variants:
            if len(unexplained) == 0:
                return empty_findings()
            decoded = decode(unexplained)
            unexplained = unexplained[[texts[i] != text for i, text in zip(unexplained.tolist(), decoded, strict=True)]]
        fold = _folder(tokenizer.special_token_strings)
        rows, messages = [], []
        for index in unexplained.tolist():
            row, text, decoded = suspect.row(index)
            if fold(text) == fold(decoded):
                # Same words and tokens; only special-token spelling or spacing differs, as
                # SGLang's detokenizer may add (`spaces_between_special_tokens`).
                continue
            at = _first_difference(text, decoded)
            rows.append(row)
            messages.append(
                f"text differs from decode(output_ids) at character {at}: "
                f"text has {text[at:at + 24]!r}, ids decode to {decoded[at:at + 24]!r}"
            )
        return findings_frame(rows, [None] * len(rows), messages)
