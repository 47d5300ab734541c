"""Prompts from the datasets people start with: ShareGPT, UltraChat and OpenAI rows, from JSONL,
Parquet, Arrow and `datasets` folders written by the real `datasets` library, normalised, counted,
refused with reasons, streamed, fuzzed; and one `audit generate` run from a ShareGPT Parquet file."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import audit.generate.datasets_in as datasets_in
from audit.base.errors import InputError
from audit.generate import iter_prompts, load_prompts, summarise_prompts
from audit.generate.conversations import (
    MAX_DEPTH,
    NORMALISATIONS,
    REFUSALS,
    ROLES,
    Dropped,
    Normalised,
    Refused,
    normalise_row,
)
from tests.conftest import KIMI_TOKENIZER, PREPARED, ROOT
from tests.generate_support import generate_args, read_samples, run_cli, template_ids

SYSTEM = {"role": "system", "content": "Answer briefly."}

SHAREGPT = [
    {
        "id": "sg-1",
        "conversations": [
            {"from": "system", "value": "Answer briefly."},
            {"from": "human", "value": "What is 2+2?"},
            {"from": "gpt", "value": "4"},
        ],
    },
    {
        "id": "sg-2",
        "conversations": [
            {"from": "human", "value": "Hi"},
            {"from": "gpt", "value": "Hello!"},
            {"from": "human", "value": "Name a prime."},
            {"from": "gpt", "value": "7"},
        ],
    },
]
SHAREGPT_PROMPTS = {
    "sg-1": [SYSTEM, {"role": "user", "content": "What is 2+2?"}],
    "sg-2": [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "Name a prime."},
    ],
}
ULTRACHAT = [
    {
        "prompt": "How do tides work?",
        "prompt_id": "u-1",
        "messages": [
            {"role": "user", "content": "How do tides work?"},
            {"role": "assistant", "content": "The moon pulls the oceans."},
            {"role": "user", "content": "Why two a day?"},
            {"role": "assistant", "content": "There is a bulge on each side."},
        ],
    },
    {
        "prompt": "Suggest a name for a cat.",
        "prompt_id": "u-2",
        "messages": [
            {"role": "user", "content": "Suggest a name for a cat."},
            {"role": "assistant", "content": "Miso."},
        ],
    },
]
ULTRACHAT_PROMPTS = {
    "u-1": ULTRACHAT[0]["messages"][:3],
    "u-2": ULTRACHAT[1]["messages"][:1],
}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
FLIGHT = {
    "type": "function",
    "function": {
        "name": "book_flight",
        "description": "Book a flight",
        "parameters": {
            "type": "object",
            "properties": {"origin": {"type": "string"}, "seats": {"type": "integer"}},
            "required": ["origin"],
        },
    },
}
OPENAI = [
    {
        "messages": [
            SYSTEM,
            {"role": "user", "content": "Weather in Oslo?"},
            {"role": "assistant", "content": "Let me look."},
        ],
        "tools": [WEATHER],
    },
    {
        "messages": [
            {"role": "user", "content": "Book me a flight from Rome."},
            {"role": "assistant", "content": "Done."},
        ],
        "tools": [FLIGHT, WEATHER],
    },
]
OPENAI_PROMPTS = {0: (OPENAI[0]["messages"][:2], [WEATHER]), 1: (OPENAI[1]["messages"][:1], [FLIGHT, WEATHER])}
FORMATS = {"sharegpt": SHAREGPT, "ultrachat": ULTRACHAT, "openai": OPENAI}


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def write_parquet(path: Path, rows: list, **kwargs) -> Path:
    pl.DataFrame(rows).write_parquet(path, **kwargs)
    return path


def save_dataset(path: Path, rows: list, **kwargs) -> Path:
    """What `Dataset.save_to_disk` writes, written by the library itself."""
    import datasets

    datasets.disable_progress_bars()
    datasets.Dataset.from_list(rows).save_to_disk(str(path), **kwargs)
    return path


def save_dataset_dict(path: Path, splits: dict[str, list]) -> Path:
    import datasets

    datasets.disable_progress_bars()
    datasets.DatasetDict(
        {name: datasets.Dataset.from_list(rows) for name, rows in splits.items()}
    ).save_to_disk(str(path))
    return path


def write_container(kind: str, directory: Path, rows: list) -> tuple[Path, str, int]:
    """`rows` in a container; its path, the name its row ids start with, the first row's number."""
    if kind == "jsonl":
        return write_jsonl(directory / "rows.jsonl", rows), "rows.jsonl", 1
    if kind == "parquet":
        return write_parquet(directory / "rows.parquet", rows), "rows.parquet", 0
    if kind == "datasets":
        return save_dataset(directory / "rows", rows), "rows", 0
    save_dataset_dict(directory / "dd", {"train": rows, "test": rows[:1]})
    return directory / "dd", "dd/train", 0


def expected_prompts(form: str, label: str, first: int) -> dict[str, tuple[list, list | None]]:
    if form == "sharegpt":
        return {key: (messages, None) for key, messages in SHAREGPT_PROMPTS.items()}
    if form == "ultrachat":
        return {key: (messages, None) for key, messages in ULTRACHAT_PROMPTS.items()}
    return {f"{label}:{first + n}": prompt for n, prompt in OPENAI_PROMPTS.items()}


# == Each format from each container ==============================================================


@pytest.mark.parametrize("container", ["jsonl", "parquet", "datasets", "datasetdict"])
@pytest.mark.parametrize("form", ["sharegpt", "ultrachat", "openai"])
def test_each_format_from_each_container_becomes_the_same_prompts(tmp_path, form, container):
    path, label, first = write_container(container, tmp_path, FORMATS[form])

    prompts = list(iter_prompts(path))
    summary = summarise_prompts(path)

    expected = expected_prompts(form, label, first)
    assert {p.key: (p.messages, p.tools) for p in prompts} == expected
    assert [p.key for p in prompts] == summary.keys == list(expected)
    assert (summary.read, summary.prompts, summary.refused_rows, summary.dropped) == (2, 2, 0, 0)
    assert summary.normalised["trailing_answers"] == 2
    assert summary.normalised["sharegpt_roles"] == (2 if form == "sharegpt" else 0)
    assert summary.normalised["row_ids"] == (2 if form == "openai" else 0)
    if container != "jsonl" and form == "openai":
        # tables give each tool every other tool's parameters, as nulls: they are dropped again
        assert summary.normalised["table_nulls"] == 2
    assert load_prompts(path) == {p.key: p.source() for p in prompts}


def test_a_datasetdict_split_is_picked_by_name_and_its_ids_say_which(tmp_path):
    path = save_dataset_dict(tmp_path / "chats", {"train": OPENAI, "test": OPENAI[1:]})
    assert summarise_prompts(path).keys == ["chats/train:0", "chats/train:1"]
    assert summarise_prompts(path, split="test").keys == ["chats/test:0"]
    # the split's folder given directly is the same dataset, with the same ids
    assert summarise_prompts(path / "test").keys == ["chats/test:0"]
    with pytest.raises(InputError, match=r"splits 'train', 'test' and no 'validation'; pick one with --split"):
        summarise_prompts(path, split="validation")
    with pytest.raises(InputError, match="this folder holds one dataset"):
        summarise_prompts(path / "train", split="train")


def test_tools_as_a_json_string_and_a_system_column_are_taken(tmp_path):
    rows = [
        {
            "system": "You are terse.",
            "conversations": [{"from": "human", "value": "Weather?"}],
            "tools": json.dumps([WEATHER]),
        }
    ]
    for path in (write_jsonl(tmp_path / "a.jsonl", rows), write_parquet(tmp_path / "a.parquet", rows)):
        [prompt] = iter_prompts(path)
        assert prompt.messages == [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Weather?"},
        ]
        assert prompt.tools == [WEATHER]
        assert {"tools_decoded", "system_column", "sharegpt_roles"} <= set(
            summarise_prompts(path).normalised
        )


def test_an_arrow_ipc_file_and_a_bare_arrow_stream_are_read(tmp_path):
    frame = pl.DataFrame(SHAREGPT)
    frame.write_ipc(tmp_path / "rows.arrow")
    frame.write_ipc_stream(tmp_path / "polars.arrows")  # string views: nanoarrow cannot, polars can
    stream = save_dataset(tmp_path / "ds", SHAREGPT) / "data-00000-of-00001.arrow"
    for path in (tmp_path / "rows.arrow", tmp_path / "polars.arrows", stream):
        assert {p.key: p.messages for p in iter_prompts(path)} == SHAREGPT_PROMPTS


# == Trailing answers =============================================================================


def test_only_the_answers_ending_the_conversation_are_dropped():
    call = {"role": "assistant", "content": None, "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "{}"}}]}
    result = {"role": "tool", "content": "42", "tool_call_id": "c1"}
    row = {
        "messages": [
            {"role": "user", "content": "Use f."},
            call,
            result,
            {"role": "assistant", "content": "It is 42."},
            {"role": "assistant", "content": "Anything else?"},
        ]
    }
    normalised = normalise_row(row)
    assert isinstance(normalised, Normalised)
    # what follows the tool's result is regenerated; the call and its result stay as context
    assert normalised.messages == [row["messages"][0], call, result]
    assert normalised.notes == {"trailing_answers", "row_ids"}
    plain = normalise_row({"id": 1, "messages": [{"role": "user", "content": "x"}]})
    assert isinstance(plain, Normalised) and plain.notes == frozenset()


# == Refusals, with their reasons =================================================================


@pytest.mark.parametrize(
    ("row", "kind", "says"),
    [
        ({"id": 1}, "no_conversation", "needs `messages`, a non-empty list of chat messages"),
        ({"messages": "hello"}, "no_conversation", "`messages` must be a list of chat messages, got a str"),
        ({"messages": ["hello"]}, "bad_turn", "messages[0] must be an object with a `role`"),
        ({"conversations": [{"value": "x"}]}, "bad_turn", "conversations[0] must be an object with a `role`"),
        ({"conversations": [{"from": "human", "value": "q"}, {"from": "bing", "value": "a"}]}, "unknown_role", "conversations[1] has the role 'bing'"),
        ({"messages": [{"role": "model", "content": "x"}]}, "unknown_role", "known roles: human, user, gpt"),
        ({"messages": [{"role": "user", "from": "gpt", "content": "x"}]}, "bad_turn", "both `from` 'gpt' and `role` 'user'"),
        ({"messages": [{"role": "user", "content": 7}]}, "bad_content", "messages[0].content must be text, got 7"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "bad_image", "messages[0].content[0].image_url must name an image"),
        ({"messages": [{"role": "user", "content": [{"type": "input_audio"}]}]}, "bad_content", "neither text nor an image"),
        ({"messages": [{"role": "user", "content": "q"}, {"role": "user", "content": " "}]}, "empty_last_user_turn", "messages[1], the last user turn, has no text"),
        ({"prompt": ""}, "empty_last_user_turn", "the `prompt` has no text"),
        ({"conversations": [{"from": "gpt", "value": "Hi!"}]}, "no_user_turn", "no user turn"),
        ({"messages": [{"role": "user", "content": "q"}], "tools": {"a": 1}}, "bad_tools", "a list of tool definitions"),
        ({"messages": [{"role": "user", "content": "q"}], "tools": "[oops"}, "bad_tools", "a string but not JSON"),
        ({"messages": [{"role": "user", "content": "q"}], "chat_template_kwargs": [1]}, "bad_template_kwargs", "got a list"),
        ({"id": 1.5, "messages": [{"role": "user", "content": "q"}]}, "bad_id", "`id` must be a non-empty string or an integer, got 1.5"),
        ({"prompt_id": "", "prompt": "q"}, "bad_id", "`prompt_id` must be"),
        ({"id": 2**70, "prompt": "q"}, "bad_id", "outside 64-bit integers"),
        ({"id": "x" * 5000, "prompt": "q"}, "bad_id", "over 1024 characters"),
        ({"prompt": "q" * 16_000_001}, "too_large", "over 16,000,000 characters of text"),
        ({"messages": [{"role": "user", "content": "q", "x": [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}]}, "too_large", f"nested more than {MAX_DEPTH} deep"),
        ({"messages": [{"role": "user", "content": "\ud800"}]}, "bad_content", "lone surrogates"),
        ({"messages": [{"role": "user", "content": "q", "w": float("nan")}]}, "bad_content", "a number that JSON cannot hold"),
        ({"messages": [{"role": "user", "content": "q", "w": b"\x00"}]}, "bad_content", "a bytes value"),
        ({"messages": [{"role": "user", "content": "q", 3: "x"}]}, "bad_content", "an object key that is not text"),
    ],
)
def test_a_row_that_cannot_be_a_prompt_is_refused_with_its_reason(row, kind, says):
    refused = normalise_row(row)
    assert isinstance(refused, Refused), refused
    assert refused.kind == kind and says in refused.reason, refused
    assert "\n" not in refused.reason and len(refused.reason) < 300


@pytest.mark.parametrize("row", [{"messages": []}, {"conversations": None}, {"id": 3, "prompt": None}])
def test_a_row_with_nothing_to_prompt_with_is_dropped(row):
    assert isinstance(normalise_row(row), Dropped)


def test_the_summary_counts_what_was_read_normalised_dropped_and_refused(tmp_path):
    sample = ROOT / "fixtures" / "prompts" / "sharegpt-sample.jsonl"
    summary = summarise_prompts(sample)
    assert (summary.read, summary.prompts, summary.refused_rows, summary.dropped) == (9, 5, 3, 1)
    assert summary.keys == ["sg-001", "sg-002", "sg-003", "sg-004", "sharegpt-sample.jsonl:9"]
    assert summary.normalised == {"sharegpt_roles": 4, "trailing_answers": 4, "row_ids": 1}
    assert summary.refused == {"unknown_role": 1, "empty_last_user_turn": 1, "no_user_turn": 1}
    assert summary.first_refused["unknown_role"] == (
        f"{sample}:5: conversations[1] has the role 'bing'; known roles: {', '.join(ROLES)}"
    )
    text = "\n".join(summary.lines())
    assert f"9 rows read from {sample} (JSONL): 5 to send, 3 refused, 1 dropped" in text
    assert f"4 {NORMALISATIONS['trailing_answers']}" in text
    assert f"refused 1: {REFUSALS['empty_last_user_turn']} (first: {sample}:6: conversations[2]" in text
    assert f"dropped 1: nothing to prompt with (first: {sample}:8: an empty `conversations`)" in text
    # --limit counts prompts sent, and the summary only what was read for them
    limited = summarise_prompts(sample, limit=4)
    assert limited.keys == summary.keys[:4] and limited.read == 4


# == Ids ==========================================================================================


def test_ids_are_the_rows_own_or_made_from_the_file_and_row(tmp_path):
    rows = [
        {"id": 7, "prompt": "a"},
        {"prompt_id": "p-2", "prompt": "b"},
        {"conversation_id": "c-3", "conversation": [{"role": "user", "content": "c"}]},
        {"prompt": "d"},
        {"id": None, "prompt_id": None, "prompt": "e"},
    ]
    jsonl = write_jsonl(tmp_path / "ids.jsonl", rows)
    assert [p.id for p in iter_prompts(jsonl)] == [7, "p-2", "c-3", "ids.jsonl:4", "ids.jsonl:5"]
    table = save_dataset(tmp_path / "ids", [{k: r.get(k) for k in ("prompt_id", "prompt")} for r in rows])
    summary = summarise_prompts(table)  # row 2 had its turns in `conversation`: no prompt left
    assert summary.keys == ["ids:0", "p-2", "ids:3", "ids:4"] and summary.dropped == 1


def test_a_repeated_id_is_one_error_naming_both_rows(tmp_path):
    rows = [{"id": "a", "prompt": "x"}, {"id": "b", "prompt": "y"}, {"id": "a", "prompt": "z"}]
    with pytest.raises(InputError, match=r"rows\.jsonl:3: id 'a' repeats line 1; every prompt needs its own id"):
        summarise_prompts(write_jsonl(tmp_path / "rows.jsonl", rows))
    with pytest.raises(InputError, match=r"rows\.parquet row 2: id 'a' repeats row 0"):
        summarise_prompts(write_parquet(tmp_path / "rows.parquet", rows))


# == Bad containers: one line naming the file (and row), before any request =========================


def test_bad_containers_are_one_line_errors(tmp_path):
    def says(path: Path, pattern: str, **kwargs) -> None:
        with pytest.raises(InputError, match=pattern) as raised:
            summarise_prompts(path, **kwargs)
        assert "\n" not in str(raised.value)

    says(tmp_path / "missing.parquet", "no such prompts file")
    (tmp_path / "array.json").write_text('[{"id": 1, "prompt": "x"}]')
    says(tmp_path / "array.json", r"a JSON array, not JSON lines; write one object a line, e\.g\. `jq -c")
    write_jsonl(tmp_path / "one.jsonl", [{"prompt": "x"}])
    says(tmp_path / "one.jsonl", "names a split of a `datasets` DatasetDict folder", split="test")
    (tmp_path / "lines.jsonl").write_text('{"prompt": "x"}\n[1, 2]\n')
    says(tmp_path / "lines.jsonl", r"lines\.jsonl:2: expected a JSON object")
    (tmp_path / "empty").mkdir()
    says(tmp_path / "empty", "not one `datasets`' save_to_disk wrote")
    folder = save_dataset(tmp_path / "ds", SHAREGPT)
    (folder / "state.json").write_text(json.dumps({"_data_files": [{"filename": "../one.jsonl"}]}))
    says(folder, r"`_data_files` names '\.\./one\.jsonl', not a file in")
    (tmp_path / "broken.parquet").write_bytes(b"PAR1" + b"\x00" * 64)
    says(tmp_path / "broken.parquet", r"broken\.parquet: cannot be read as Parquet \(")
    write_parquet(tmp_path / "other.parquet", [{"text": "x", "label": 1}])
    says(tmp_path / "other.parquet", r"no column a prompt is made of .*; its columns: text, label")
    write_jsonl(tmp_path / "refused.jsonl", [{"conversations": [{"from": "bot", "value": "x"}]}])
    says(tmp_path / "refused.jsonl", r"no prompts to send: 1 rows read, 1 refused, 0 dropped; e\.g\. .*the role 'bot'")


def test_a_data_file_that_links_out_of_its_datasets_folder_is_refused(tmp_path):
    folder = save_dataset(tmp_path / "ds", SHAREGPT)
    expected = summarise_prompts(folder).keys
    (data,) = folder.glob("data-*.arrow")
    # A link to a file inside the folder is the folder's own data: read as before.
    data.rename(folder / "kept.arrow")
    data.symlink_to("kept.arrow")
    assert summarise_prompts(folder).keys == expected
    # A link out of it is refused, naming the link and where it points.
    outside = tmp_path / "elsewhere.arrow"
    (folder / "kept.arrow").rename(outside)
    data.unlink()
    data.symlink_to(outside)
    with pytest.raises(InputError) as raised:
        summarise_prompts(folder)
    message = str(raised.value)
    assert message.startswith(f"{data}: a link to {outside}, outside {folder}; ") and "\n" not in message
    # A DatasetDict whose split folder is a link out of it: its data files are outside too.
    splits = save_dataset_dict(tmp_path / "dd", {"train": SHAREGPT})
    (splits / "train").rename(tmp_path / "train-elsewhere")
    (splits / "train").symlink_to(tmp_path / "train-elsewhere")
    with pytest.raises(InputError, match=rf"a link to {tmp_path / 'train-elsewhere'}/data-.*, outside {splits}; "):
        summarise_prompts(splits)


def test_bad_jsonl_lines_are_one_error_or_each_skipped_counted_and_listed(tmp_path):
    rows = [json.dumps({"id": i, "prompt": f"question {i}"}).encode() for i in range(4)]
    path = tmp_path / "rows.jsonl"
    path.write_bytes(b"\n".join([rows[0], b'{"id": 9, "prompt": ', rows[1], b'"text"', b"\xff\xfe{}", rows[2], rows[3]]) + b"\n")
    with pytest.raises(datasets_in.BadLine, match=r"rows\.jsonl:2: not valid JSON \(") as raised:
        summarise_prompts(path)
    assert raised.value.where == f"{path}:2"
    summary = summarise_prompts(path, skip_bad_lines=True)
    assert summary.keys == ["0", "1", "2", "3"] and summary.read == 7 and summary.skipped == 3
    assert [line for line, _ in summary.skipped_lines] == [2, 4, 5]
    assert summary.skipped_lines[1][1] == "expected a JSON object (a prompt or a conversation), got a str"
    assert summary.skipped_lines[2][1].startswith("not valid JSON (")
    text = summary.lines()
    assert text[0].endswith("4 to send, 0 refused, 0 dropped, 3 bad lines skipped")
    assert text[-3:] == [f"  skipped {path}:{line}: {reason}" for line, reason in summary.skipped_lines]
    assert summary.skipped_record() == {
        "count": 3, "lines": [{"line": line, "reason": reason} for line, reason in summary.skipped_lines]
    }
    assert [p.key for p in iter_prompts(path, skip_bad_lines=True)] == summary.keys
    # Many bad lines: each counted, the first LISTED_SKIPS listed, the rest said in one line.
    from audit.generate.prompts import LISTED_SKIPS

    path.write_bytes(b"not json\n" * (LISTED_SKIPS + 5) + rows[0] + b"\n")
    many = summarise_prompts(path, skip_bad_lines=True)
    assert many.skipped == LISTED_SKIPS + 5 and len(many.skipped_lines) == LISTED_SKIPS
    assert many.lines()[-1] == f"  skipped 5 more bad lines (the first {LISTED_SKIPS} are listed here and in generation.json)"
    # Nothing but bad lines: no prompt to send, one line that says why.
    path.write_bytes(b"7\n[1]\n")
    with pytest.raises(InputError, match=r"no prompts to send: 2 rows read, 0 refused, 0 dropped, 2 bad lines skipped; e\.g\. .*rows\.jsonl:1: expected a JSON object"):
        summarise_prompts(path, skip_bad_lines=True)


def test_generate_says_what_is_wrong_with_the_dataset_in_one_line_and_sends_nothing(servers, tmp_path):
    server = servers()
    folder = save_dataset_dict(tmp_path / "dd", {"train_sft": SHAREGPT})
    result = run_cli(generate_args(folder, tmp_path / "out.jsonl", server.url))
    assert result.exit_code == 2
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1
    assert "'train_sft' and no 'train'; pick one with --split" in result.output
    assert server.generate_requests == 0


# == Streaming ====================================================================================


def test_tables_are_read_a_batch_at_a_time_and_rows_numbered_across_batches(tmp_path, monkeypatch):
    monkeypatch.setattr(datasets_in, "BATCH_ROWS", 7)
    heights: list[int] = []
    read = datasets_in._table_batches

    def counted(container, file):
        for frame in read(container, file):
            heights.append(frame.height)
            yield frame

    monkeypatch.setattr(datasets_in, "_table_batches", counted)
    rows = [{"prompt": f"question {n}"} for n in range(100)]
    parquet = write_parquet(tmp_path / "big.parquet", rows, row_group_size=10)
    assert summarise_prompts(parquet).keys == [f"big.parquet:{n}" for n in range(100)]
    assert max(heights) <= 7 and sum(heights) == 100

    heights.clear()
    folder = save_dataset(tmp_path / "big", rows, max_shard_size="1KB")  # several data-*.arrow
    assert len(list(folder.glob("data-*.arrow"))) > 1
    assert summarise_prompts(folder).keys == [f"big:{n}" for n in range(100)]
    assert sum(heights) == 100 and len(heights) > 1

    # the first prompt is there after one batch: nothing reads the whole file first
    heights.clear()
    first = next(iter_prompts(parquet))
    assert first.messages == [{"role": "user", "content": "question 0"}] and heights == [7]


def test_jsonl_is_read_a_line_at_a_time_and_a_huge_line_is_refused_without_reading_it(tmp_path, monkeypatch):
    path = tmp_path / "big.jsonl"
    path.write_text('{"prompt": "first"}\nthis line is not JSON\n')
    assert next(iter_prompts(path)).messages == [{"role": "user", "content": "first"}]

    monkeypatch.setattr(datasets_in, "MAX_ROW_BYTES", 100)
    huge = json.dumps({"prompt": "x" * (3 << 20)})
    path.write_text('{"prompt": "a"}\n' + huge + '\n{"prompt": "b"}\n')
    summary = summarise_prompts(path)
    assert summary.keys == ["big.jsonl:1", "big.jsonl:3"]
    assert summary.first_refused["too_large"] == f"{path}:2: a line of {len(huge) + 1:,} bytes, over the 100 a row may have"


# == Fuzzing the normaliser =======================================================================

TEXT = st.text(max_size=8)
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | TEXT | st.binary(max_size=3),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(TEXT, children, max_size=3),
    max_leaves=6,
)
ROLE_NAMES = st.sampled_from([*ROLES, "bing", "model", "", "USER"]) | JSON_VALUES
TURNS = st.fixed_dictionaries(
    {},
    optional={
        "from": ROLE_NAMES,
        "role": ROLE_NAMES,
        "value": TEXT | JSON_VALUES,
        "content": TEXT | JSON_VALUES | st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": TEXT})),
        "tool_calls": JSON_VALUES,
    },
) | JSON_VALUES
ROWS = st.fixed_dictionaries(
    {},
    optional={
        "id": JSON_VALUES,
        "prompt_id": JSON_VALUES,
        "messages": st.lists(TURNS, max_size=5) | JSON_VALUES,
        "conversations": st.lists(TURNS, max_size=5) | JSON_VALUES,
        "prompt": TEXT | JSON_VALUES,
        "system": TEXT | JSON_VALUES,
        "tools": JSON_VALUES | st.just("[{}]"),
        "chat_template_kwargs": JSON_VALUES,
    },
) | JSON_VALUES


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ROWS, st.booleans())
def test_fuzz_the_normaliser_refuses_or_gives_a_prompt_and_never_raises(row, from_table):
    result = normalise_row(row, from_table=from_table)
    if isinstance(result, Refused):
        assert result.kind in REFUSALS and result.reason and "\n" not in result.reason
        return
    if isinstance(result, Dropped):
        return
    assert isinstance(result, Normalised)
    assert result.notes <= set(NORMALISATIONS)
    assert result.messages and all(m["role"] in set(ROLES.values()) for m in result.messages)
    assert result.messages[-1]["role"] != "assistant"
    users = [m for m in result.messages if m["role"] == "user"]
    last = users[-1]["content"]
    assert (last if isinstance(last, str) else "".join(p["text"] for p in last)).strip()
    assert result.tools is None or all(isinstance(t, dict) for t in result.tools)
    assert result.id is None or (isinstance(result.id, str | int) and not isinstance(result.id, bool))
    json.dumps(result.messages)  # what is sent and written is JSON


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(st.lists(st.binary(max_size=40) | ROWS.map(lambda row: json.dumps(row, default=repr).encode()), min_size=1, max_size=6))
def test_fuzz_a_hostile_jsonl_file_is_prompts_or_one_line_error(tmp_path, lines):
    path = tmp_path / "hostile.jsonl"
    path.write_bytes(b"\n".join(line.replace(b"\n", b" ") for line in lines) + b"\n")
    try:
        summary = summarise_prompts(path)
    except InputError as error:
        assert "\n" not in str(error) and str(path) in str(error)
        return
    assert summary.prompts == len(summary.keys) == len(set(summary.keys))
    assert summary.read == summary.prompts + summary.refused_rows + summary.dropped
    # Skipping bad lines never reads fewer prompts, and counts every row read.
    try:
        skipping = summarise_prompts(path, skip_bad_lines=True)
    except InputError as error:
        assert not isinstance(error, datasets_in.BadLine) and "\n" not in str(error)
        return
    assert skipping.keys[: len(summary.keys)] == summary.keys
    assert skipping.read == skipping.prompts + skipping.refused_rows + skipping.dropped + skipping.skipped


# == audit check --prompts, and an end-to-end run =================================================


def test_check_prompts_reads_the_partitions_prompts_as_a_sharegpt_parquet_file(tmp_path):
    import audit

    records = [json.loads(line) for line in (PREPARED / "B0_clean" / "raw_responses.jsonl").read_text().splitlines()]
    sharegpt = {"user": "human", "assistant": "gpt", "system": "system"}
    rows = [
        {
            "id": r["id"],
            "conversations": [{"from": sharegpt[m["role"]], "value": m["content"]} for m in r["messages"]],
            "tools": json.dumps(r["tools"]),
        }
        for r in records
    ]
    bare = write_jsonl(tmp_path / "raw_responses.jsonl", [{k: v for k, v in r.items() if k not in ("messages", "tools")} for r in records])

    def findings(prompts: Path) -> list[tuple[int, str]]:
        report = audit.check_target(bare, profile="kimi-k2.5", tokenizer=KIMI_TOKENIZER, prompts=prompts, cache=False)
        return [(f["line"], f["rule"]) for f in report.findings.iter_rows(named=True)]

    assert findings(write_parquet(tmp_path / "good.parquet", rows)) == []
    rows[1]["conversations"] = [{"from": "human", "value": "something else entirely"}]
    assert findings(write_parquet(tmp_path / "bad.parquet", rows)) == [(2, "TPL001")]

    # a row --prompts refuses gives TPL001 no source: the check says so before its table
    rows[1]["conversations"] = [{"from": "narrator", "value": "x"}]
    refused = write_parquet(tmp_path / "refused.parquet", rows)
    result = run_cli(["check", str(bare), "--profile", "kimi-k2.5", "--tokenizer", str(KIMI_TOKENIZER),
                      "--prompts", str(refused), "--report", str(tmp_path / "r.json"), "--no-cache"])
    assert result.exit_code == 0, result.output
    assert f"{len(rows)} rows read from {refused} (Parquet): {len(rows) - 1} to send, 1 refused" in result.output
    assert f"{refused} row 1: conversations[0] has the role 'narrator'" in result.output


def test_generate_from_a_sharegpt_parquet_file_sends_the_normalised_prompts(servers, tmp_path, kimi_tokenizer):
    from audit.flows.checking import check_session
    from audit.flows.session import CheckOptions, prepare
    from audit.flows.targets import resolve_target

    server = servers()
    rows = [
        *SHAREGPT,
        {"id": "sg-3", "conversations": [{"from": "human", "value": "hello"}, {"from": "\x1b[2Jbard", "value": "hi"}]},
        {"id": "sg-4", "conversations": [{"from": "human", "value": "Count to three."}, {"from": "gpt", "value": "1 2 3"}]},
    ]
    prompts = write_parquet(tmp_path / "sharegpt.parquet", rows)
    out = tmp_path / "B9" / "raw_responses.jsonl"

    result = run_cli(generate_args(prompts, out, server.url))

    assert result.exit_code == 0, result.output
    assert f"prompts: 4 rows read from {prompts} (Parquet): 3 to send, 1 refused, 0 dropped" in result.output
    assert "the role '\\x1b[2Jbard'" in result.output and "\x1b" not in result.output  # shown, inert
    samples = {s["id"]: s for s in read_samples(out)}
    expected = {**SHAREGPT_PROMPTS, "sg-4": [{"role": "user", "content": "Count to three."}]}
    assert {key: s["messages"] for key, s in samples.items()} == expected
    for sample in samples.values():
        assert sample["input_ids"] == template_ids(kimi_tokenizer, sample)
        assert sample["output_ids"] == server.sent[tuple(sample["input_ids"])]
    assert server.generate_requests == 3
    report = check_session(prepare(resolve_target(str(out.parent), tmp_path), CheckOptions()))
    assert report.verdict == "pass" and report.records == 3


def test_the_docs_examples_run_as_written(tmp_path):
    """docs/generating-from-datasets.md: each command and Python block, with the exit code it states."""
    import os
    import subprocess
    import sys

    from tests.test_readme import code_blocks, shell_commands

    doc = ROOT / "docs" / "generating-from-datasets.md"
    examples = []
    for first, language, body in code_blocks(doc.read_text(encoding="utf-8")):
        if language == "bash":
            examples += [(e.line, ["bash", "-c", e.text], e.exit_code) for e in shell_commands(first, body)]
        elif language == "python":
            examples.append((first, [sys.executable, "-c", body], 0))
    assert len(examples) >= 10
    for name in ("fixtures", "tests"):  # what the examples read; what they write goes to tryout/
        (tmp_path / name).symlink_to(ROOT / name)
    env = {k: v for k, v in os.environ.items() if k not in ("AUDIT_DATA_ROOT", "COLUMNS")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    try:
        for line, argv, exit_code in examples:
            done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
                                  check=False, stdin=subprocess.DEVNULL)
            assert done.returncode == exit_code, (
                f"{doc.name}:{line}: {argv[-1]!r} exited {done.returncode}, the doc says {exit_code}\n"
                f"--- stdout\n{done.stdout[-3000:]}\n--- stderr\n{done.stderr[-3000:]}"
            )
    finally:
        standin = tmp_path / "tryout" / "standin-datasets.pid"
        if standin.is_file():  # a failure between starting the stand-in and stopping it
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(standin.read_text()), 15)
