"""The record contract as a pandera model on polars.

Parsing already fixes the column types; the contract adds what a type cannot say: a prompt
that is present and non-empty, ids inside the tokenizer's vocabulary, and `meta_info` counts
that equal the list lengths. Each check is named after the kind of problem it finds
(`PROBLEMS`); the rule that reports a kind names it (`Rule.problem`), so a failure case maps
straight onto a finding.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import polars as pl

from audit.base.lean_imports import pandera_polars
from audit.model.tokenizer import Tokenizer
from audit.records.line_reading import CONTRACT

if TYPE_CHECKING:
    import pandera.polars as pa
else:
    pa = pandera_polars()  # pandera's polars API, without its pandas half (audit.base.lean_imports)

# The kinds of problem the contract finds, beside the reader's (`audit.records.reader`).
OUT_OF_VOCABULARY = "out_of_vocabulary"  # an id the tokenizer in use does not have
COUNT_MISMATCH = "count_mismatch"  # meta_info token counts that differ from the id lists
PROBLEMS = (CONTRACT, OUT_OF_VOCABULARY, COUNT_MISMATCH)

# The `meta_info.finish_reason.type` values SGLang writes.
FINISH_TYPES = ("stop", "length", "abort")


def in_vocabulary(tokenizer: Tokenizer) -> pl.Expr:
    """Element-wise: is this id one the tokenizer can decode?"""
    element = pl.element()
    in_range = (element >= 0) & (element < tokenizer.vocab_size)
    if tokenizer.contiguous:
        return in_range
    known = pl.lit(pl.Series(sorted(tokenizer.known_ids), dtype=pl.Int64)).implode()
    return in_range & element.is_in(known)


def all_in_vocabulary(tokenizer: Tokenizer, ids: pl.Expr) -> pl.Expr:
    """Per list: is every id one the tokenizer can decode? (True for an empty list, null for a
    missing one.) A vocabulary without holes needs only each list's smallest and largest id."""
    if tokenizer.contiguous:
        return (ids.list.min() >= 0) & (ids.list.max() < tokenizer.vocab_size) | (ids.list.len() == 0)
    return ids.list.eval(in_vocabulary(tokenizer).all()).list.first()


class ExpressionCheck(pa.Check):
    """A pandera check written as one polars expression over its column (True where it holds).

    pandera runs it like any check (`schema.validate`); `contract_failures` evaluates all of a
    schema's expressions in one query, without pandera's per-call validation machinery (~10 ms
    a block, most of the contract's cost).
    """

    def __init__(self, expression: Callable[[pl.Expr], pl.Expr], problem: str):
        self.expression = expression
        super().__init__(
            lambda data: data.lazyframe.select(expression(pl.col(data.key))), name=problem, ignore_na=False
        )

    @classmethod
    def get_backend(cls, check_obj: Any) -> Any:
        # pandera keeps its backends per check class: this one runs as a plain `Check`.
        return pa.Check.get_backend(check_obj)


def record_contract(tokenizer: Tokenizer) -> pa.DataFrameSchema:
    """The contract every parsed record must meet, for this tokenizer's vocabulary."""

    def present_and_nonempty(ids: pl.Expr) -> pl.Expr:
        return (ids.list.len() > 0).fill_null(False)

    def present(ids: pl.Expr) -> pl.Expr:
        return ids.is_not_null()

    def known_to_the_tokenizer(ids: pl.Expr) -> pl.Expr:
        return all_in_vocabulary(tokenizer, ids).fill_null(True)

    def counts(list_column: str) -> Callable[[pl.Expr], pl.Expr]:
        def check(count: pl.Expr) -> pl.Expr:
            return (count.is_null() | (count == pl.col(list_column).list.len())).fill_null(True)

        return check

    def known_finish_type(kind: pl.Expr) -> pl.Expr:
        # Any other type would slip past every termination rule, which test for these three.
        return kind.is_in(FINISH_TYPES).fill_null(True)

    return pa.DataFrameSchema(
        {
            "line": pa.Column(pl.UInt32),
            "id": pa.Column(pl.String, nullable=True),
            "input_ids": pa.Column(
                pl.List(pl.Int64),
                nullable=True,
                checks=[
                    ExpressionCheck(present_and_nonempty, CONTRACT),
                    ExpressionCheck(known_to_the_tokenizer, OUT_OF_VOCABULARY),
                ],
            ),
            "output_ids": pa.Column(
                pl.List(pl.Int64),
                nullable=True,
                checks=[
                    ExpressionCheck(present, CONTRACT),
                    ExpressionCheck(known_to_the_tokenizer, OUT_OF_VOCABULARY),
                ],
            ),
            "finish_type": pa.Column(
                pl.String, nullable=True, checks=[ExpressionCheck(known_finish_type, CONTRACT)]
            ),
            "prompt_tokens": pa.Column(
                pl.Int64, nullable=True, checks=[ExpressionCheck(counts("input_ids"), COUNT_MISMATCH)]
            ),
            "completion_tokens": pa.Column(
                pl.Int64, nullable=True, checks=[ExpressionCheck(counts("output_ids"), COUNT_MISMATCH)]
            ),
        },
        strict=False,
    )


FAILURES_SCHEMA = {"row": pl.UInt32, "problem": pl.String, "column": pl.String}


def contract_failures(schema: pa.DataFrameSchema, records: pl.DataFrame) -> pl.DataFrame:
    """Rows that break the contract's checks: columns `row` (index into `records`), `problem`,
    `column`, in the schema's order of columns and checks, as pandera reports them.

    The checks are the schema's `ExpressionCheck`s, evaluated in one polars query (a schema with
    other checks is validated by pandera itself). The column types are the reader's to fix
    (`audit.records.reader.RECORD_COLUMNS`): no rule reports them.
    """
    if records.is_empty():
        return pl.DataFrame(schema=FAILURES_SCHEMA)
    checks = [(name, check) for name, column in schema.columns.items() for check in column.checks]
    if not all(isinstance(check, ExpressionCheck) for _, check in checks):
        return validated_by_pandera(schema, records)
    passed = records.select(
        check.expression(pl.col(name)).fill_null(False).alias(str(index))
        for index, (name, check) in enumerate(checks)
    )
    found = [pl.DataFrame(schema=FAILURES_SCHEMA)]
    for index, (name, check) in enumerate(checks):
        rows = passed.get_column(str(index)).not_().arg_true()
        if len(rows):
            found.append(
                pl.DataFrame(
                    {"row": rows, "problem": [check.name] * len(rows), "column": [name] * len(rows)},
                    schema=FAILURES_SCHEMA,
                )
            )
    return pl.concat(found, how="vertical").unique(maintain_order=True)


def validated_by_pandera(schema: pa.DataFrameSchema, records: pl.DataFrame) -> pl.DataFrame:
    """`contract_failures` as pandera's own `validate` finds them (the reference)."""
    from pandera.errors import SchemaErrors  # pandera is imported by now (pandera_polars)

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
