"""The record contract as a pandera model on polars.

Parsing already fixes the column types; the contract adds what a type cannot say: a prompt
that is present and non-empty, ids inside the tokenizer's vocabulary, and `meta_info` counts
that equal the list lengths. Each check is named after the kind of problem it finds
(`PROBLEMS`); the rule that reports a kind names it (`Rule.problem`), so a failure case maps
straight onto a finding.
"""

from __future__ import annotations

import pandera.polars as pa
import polars as pl
from pandera.errors import SchemaErrors

from audit.records import CONTRACT
from audit.tokenizer import Tokenizer

# The kinds of problem the contract finds, beside the reader's (`audit.records`).
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


def record_contract(tokenizer: Tokenizer) -> pa.DataFrameSchema:
    """The contract every parsed record must meet, for this tokenizer's vocabulary."""
    in_vocab = in_vocabulary(tokenizer)

    def present_and_nonempty(data: pa.PolarsData) -> pl.LazyFrame:
        return data.lazyframe.select((pl.col(data.key).list.len() > 0).fill_null(False))

    def present(data: pa.PolarsData) -> pl.LazyFrame:
        return data.lazyframe.select(pl.col(data.key).is_not_null())

    def all_in_vocabulary(data: pa.PolarsData) -> pl.LazyFrame:
        return data.lazyframe.select(
            pl.col(data.key).list.eval(in_vocab.all()).list.first().fill_null(True)
        )

    def counts(list_column: str):
        def check(data: pa.PolarsData) -> pl.LazyFrame:
            count = pl.col(data.key)
            return data.lazyframe.select(
                (count.is_null() | (count == pl.col(list_column).list.len())).fill_null(True)
            )

        return check

    def known_finish_type(data: pa.PolarsData) -> pl.LazyFrame:
        # Any other type would slip past every termination rule, which test for these three.
        return data.lazyframe.select(pl.col(data.key).is_in(FINISH_TYPES).fill_null(True))

    def contract_check(fn, problem: str) -> pa.Check:
        return pa.Check(fn, name=problem, ignore_na=False)

    return pa.DataFrameSchema(
        {
            "line": pa.Column(pl.UInt32),
            "id": pa.Column(pl.String, nullable=True),
            "input_ids": pa.Column(
                pl.List(pl.Int64),
                nullable=True,
                checks=[
                    contract_check(present_and_nonempty, CONTRACT),
                    contract_check(all_in_vocabulary, OUT_OF_VOCABULARY),
                ],
            ),
            "output_ids": pa.Column(
                pl.List(pl.Int64),
                nullable=True,
                checks=[
                    contract_check(present, CONTRACT),
                    contract_check(all_in_vocabulary, OUT_OF_VOCABULARY),
                ],
            ),
            "finish_type": pa.Column(
                pl.String, nullable=True, checks=[contract_check(known_finish_type, CONTRACT)]
            ),
            "prompt_tokens": pa.Column(
                pl.Int64, nullable=True, checks=[contract_check(counts("input_ids"), COUNT_MISMATCH)]
            ),
            "completion_tokens": pa.Column(
                pl.Int64, nullable=True, checks=[contract_check(counts("output_ids"), COUNT_MISMATCH)]
            ),
        },
        strict=False,
    )


def contract_failures(schema: pa.DataFrameSchema, records: pl.DataFrame) -> pl.DataFrame:
    """Rows that break the contract: columns `row` (index into `records`), `problem`, `column`."""
    empty = pl.DataFrame(schema={"row": pl.UInt32, "problem": pl.String, "column": pl.String})
    if records.is_empty():
        return empty
    try:
        schema.validate(records, lazy=True)
    except SchemaErrors as errors:
        cases = errors.failure_cases
        return (
            cases.filter(pl.col("index").is_not_null())
            .select(
                pl.col("index").cast(pl.UInt32).alias("row"),
                pl.col("check").alias("problem"),
                pl.col("column").cast(pl.String),
            )
            .unique(maintain_order=True)
        )
    return empty
