"""The record contract: a pandera model on polars, its checks written as polars expressions.

Parsing already fixes the column types; the contract adds what a type cannot say: a prompt
that is present and non-empty, ids inside the tokenizer's vocabulary (the stop id SGLang
reports as `matched` too), and `meta_info` counts that equal the list lengths. Each check is named after the kind of problem it finds
(`PROBLEMS`); the rule that reports a kind names it (`Rule.problem`), so a failure case maps
straight onto a finding.

The audit evaluates the checks in one polars query per block (`contract_failures`); the same
checks make the pandera schema (`RecordContract.schema`), which validates exactly alike
(`validated_by_pandera`, compared in the tests). pandera is imported only when a schema is
made: its import (with pydantic's) is ~85 ms of every process's start that an audit does not
need.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any

import polars as pl

from audit.base.lean_imports import pandera_polars
from audit.model.tokens.tokenizer import Tokenizer
from audit.records.line_reading import CONTRACT

if TYPE_CHECKING:
    import pandera.polars as pa

# The kinds of problem the contract finds, beside the reader's (`audit.records.reader`).
OUT_OF_VOCABULARY = "out_of_vocabulary"  # an id the tokenizer in use does not have
COUNT_MISMATCH = "count_mismatch"  # meta_info token counts that differ from the id lists
PROBLEMS = (CONTRACT, OUT_OF_VOCABULARY, COUNT_MISMATCH)

# The `meta_info.finish_reason.type` values SGLang writes.
FINISH_TYPES = ("stop", "length", "abort")


def in_vocabulary(tokenizer: Tokenizer) -> pl.Expr:
    """Element-wise: is this id one the tokenizer can decode?"""
    return known_token(tokenizer, pl.element())


def known_token(tokenizer: Tokenizer, token: pl.Expr) -> pl.Expr:
    """Is this id (a column of ids, or `pl.element()` in a list's) one the tokenizer can decode?
    (null for a missing one.)"""
    in_range = (token >= 0) & (token < tokenizer.vocab_size)
    if tokenizer.contiguous:
        return in_range
    return in_range & token.is_in(pl.lit(pl.Series(sorted(tokenizer.known_ids), dtype=pl.Int64)).implode())


def all_in_vocabulary(tokenizer: Tokenizer, ids: pl.Expr) -> pl.Expr:
    """Per list: is every id one the tokenizer can decode? (True for an empty list, null for a
    missing one.) A vocabulary without holes needs only each list's smallest and largest id."""
    if tokenizer.contiguous:
        return (ids.list.min() >= 0) & (ids.list.max() < tokenizer.vocab_size) | (ids.list.len() == 0)
    return ids.list.eval(in_vocabulary(tokenizer).all()).list.first()


@dataclass(frozen=True)
class ContractCheck:
    """One check of a column: an expression over it, True where the check holds."""

    column: str
    expression: Callable[[pl.Expr], pl.Expr]
    problem: str  # the kind of problem a failure is (`PROBLEMS`)


@dataclass(frozen=True)
class RecordContract:
    """The contract's columns (type, nullable) and checks, in pandera's order of columns then
    checks; `schema()` makes them the pandera model."""

    columns: dict[str, tuple[pl.DataType, bool]]
    checks: tuple[ContractCheck, ...]

    def schema(self) -> pa.DataFrameSchema:
        """The pandera model (pandera imported now, without its pandas half)."""
        pa = pandera_polars()
        check = _expression_check_class()
        return pa.DataFrameSchema(
            {
                name: pa.Column(
                    dtype,
                    nullable=nullable,
                    checks=[check(c.expression, c.problem) for c in self.checks if c.column == name] or None,
                )
                for name, (dtype, nullable) in self.columns.items()
            },
            strict=False,
        )


@cache
def _expression_check_class() -> type:
    """A pandera check written as one polars expression over its column (True where it holds)."""
    pa = pandera_polars()

    class ExpressionCheck(pa.Check):  # type: ignore[name-defined]
        def __init__(self, expression: Callable[[pl.Expr], pl.Expr], problem: str):
            self.expression = expression
            super().__init__(
                lambda data: data.lazyframe.select(expression(pl.col(data.key))), name=problem, ignore_na=False
            )

        @classmethod
        def get_backend(cls, check_obj: Any) -> Any:
            # pandera keeps its backends per check class: this one runs as a plain `Check`.
            return pa.Check.get_backend(check_obj)

    return ExpressionCheck


def record_contract(tokenizer: Tokenizer) -> RecordContract:
    """The contract every parsed record must meet, for this tokenizer's vocabulary."""

    def present_and_nonempty(ids: pl.Expr) -> pl.Expr:
        return (ids.list.len() > 0).fill_null(False)

    def present(ids: pl.Expr) -> pl.Expr:
        return ids.is_not_null()

    def known_to_the_tokenizer(ids: pl.Expr) -> pl.Expr:
        return all_in_vocabulary(tokenizer, ids).fill_null(True)

    def a_known_token(token: pl.Expr) -> pl.Expr:
        return known_token(tokenizer, token).fill_null(True)

    def counts(list_column: str) -> Callable[[pl.Expr], pl.Expr]:
        def check(count: pl.Expr) -> pl.Expr:
            return (count.is_null() | (count == pl.col(list_column).list.len())).fill_null(True)

        return check

    def expanded_prompt(count: pl.Expr) -> pl.Expr:
        # A record that sends images: the server counted each placeholder expanded, which only
        # the image rules can work out (INT005's own step, `audit.checks.integrity`).
        sends_images = pl.col("image_data").list.len().fill_null(0) > 0
        return counts("input_ids")(count) | sends_images

    def known_finish_type(kind: pl.Expr) -> pl.Expr:
        # Any other type would slip past every termination rule, which test for these three.
        return kind.is_in(FINISH_TYPES).fill_null(True)

    return RecordContract(
        columns={
            "line": (pl.UInt32(), False),
            "id": (pl.String(), True),
            "input_ids": (pl.List(pl.Int64()), True),
            "output_ids": (pl.List(pl.Int64()), True),
            "finish_type": (pl.String(), True),
            "finish_matched_id": (pl.Int64(), True),
            "prompt_tokens": (pl.Int64(), True),
            "completion_tokens": (pl.Int64(), True),
            "image_data": (pl.List(pl.String()), True),
        },
        checks=(
            ContractCheck("input_ids", present_and_nonempty, CONTRACT),
            ContractCheck("input_ids", known_to_the_tokenizer, OUT_OF_VOCABULARY),
            ContractCheck("output_ids", present, CONTRACT),
            ContractCheck("output_ids", known_to_the_tokenizer, OUT_OF_VOCABULARY),
            ContractCheck("finish_type", known_finish_type, CONTRACT),
            ContractCheck("finish_matched_id", a_known_token, OUT_OF_VOCABULARY),
            ContractCheck("prompt_tokens", expanded_prompt, COUNT_MISMATCH),
            ContractCheck("completion_tokens", counts("output_ids"), COUNT_MISMATCH),
        ),
    )


FAILURES_SCHEMA = {"row": pl.UInt32, "problem": pl.String, "column": pl.String}
# Frames are never changed in place: every block without a failure shares this one.
_NO_FAILURES = pl.DataFrame(schema=FAILURES_SCHEMA)


def contract_failures(contract: RecordContract, records: pl.DataFrame) -> pl.DataFrame:
    """Rows that break the contract's checks: columns `row` (index into `records`), `problem`,
    `column`, in the contract's order of columns and checks, as pandera reports them.

    The checks' expressions are evaluated in one polars query, without pandera's per-call
    validation machinery (~10 ms a block). The column types are the reader's to fix
    (`audit.records.reader.RECORD_COLUMNS`): no rule reports them.
    """
    if records.is_empty():
        return _NO_FAILURES
    checks = [
        check.expression(pl.col(check.column)).fill_null(False).alias(str(index))
        for index, check in enumerate(contract.checks)
    ]
    if records.select(pl.all_horizontal(checks).all()).item():
        return _NO_FAILURES  # nearly every block: one query
    passed = records.select(checks)
    found = [pl.DataFrame(schema=FAILURES_SCHEMA)]
    for index, check in enumerate(contract.checks):
        rows = passed.get_column(str(index)).not_().arg_true()
        if len(rows):
            found.append(
                pl.DataFrame(
                    {"row": rows, "problem": [check.problem] * len(rows), "column": [check.column] * len(rows)},
                    schema=FAILURES_SCHEMA,
                )
            )
    return pl.concat(found, how="vertical").unique(maintain_order=True)


def validated_by_pandera(contract: RecordContract, records: pl.DataFrame) -> pl.DataFrame:
    """`contract_failures` as pandera's own `validate` of the contract's schema finds them (the
    reference)."""
    schema = contract.schema()
    from pandera.errors import SchemaErrors  # imported by now (`RecordContract.schema`)

    if records.is_empty():
        return pl.DataFrame(schema=FAILURES_SCHEMA)
    try:
        schema.validate(records, lazy=True)
    except SchemaErrors as errors:
        cases = errors.failure_cases
        return (
            cases.filter(pl.col("index").is_not_null() & pl.col("check").is_in(PROBLEMS))
            .select(
                pl.col("index").cast(pl.UInt32).alias("row"),
                pl.col("check").alias("problem"),
                pl.col("column").cast(pl.String),
            )
            .unique(maintain_order=True)
        )
    return pl.DataFrame(schema=FAILURES_SCHEMA)
