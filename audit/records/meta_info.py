"""The `meta_info` SGLang's `/generate` writes, field by field: the JSON type of each, checked on
the strictly read value, and the one relation between them that holds whatever the request.

Read from SGLang 0.5.23: `TokenizerManager._handle_batch_output` (`srt/managers/tokenizer_manager.py`:
id, finish_reason, prompt_tokens, weight_version, num_retractions; reasoning_tokens,
completion_tokens, cached_tokens, cached_tokens_details, weight_versions; image, audio and video
token counts; hidden_states, routed_experts, indexer_topk, dp_rank; e2e_latency),
`convert_logprob_style` (the logprob lists), `_calculate_spec_decoding_metrics` (spec_*), the
request's and the scheduler's time stats (`srt/observability/req_time_stats.py`, with
`--enable-metrics`), and the finish reasons' `to_json` (`srt/managers/schedule_batch.py`:
`FINISH_MATCHED_TOKEN`, `FINISH_MATCHED_STR`, `FINISHED_MATCHED_REGEX`, `FINISH_LENGTH`,
`FINISH_ABORT`). A field SGLang does not write is accepted as it is (SGLang adds fields, and
a request's `customized_info` adds its own); a field given as null is taken as absent.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

from audit.base.json_values import json_type

# A token id is an integer below this (SGLang's ids are unsigned 32-bit), in every id list and in
# `matched`.
TOKEN_ID_LIMIT = 1 << 32
# The counts polars reads are 64-bit.
_COUNT_LIMIT = 1 << 63


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < _COUNT_LIMIT


def _is_number(value: Any) -> bool:
    # Strict JSON has no NaN or Infinity: every number read is finite.
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_non_negative(value: Any) -> bool:
    return _is_number(value) and value >= 0


def _is_token_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < TOKEN_ID_LIMIT


def _is_details(value: Any) -> bool:
    # {"device": N, "host": N, "storage": N, "storage_backend": "..."} (`get_cached_tokens_details`)
    return isinstance(value, dict) and all(_is_count(v) or isinstance(v, str) for v in value.values())


def _is_list(value: Any) -> bool:
    return isinstance(value, list)


def _is_string(value: Any) -> bool:
    return isinstance(value, str)


# (what holds, how the contract says it)
_Kind = tuple[Callable[[Any], bool], str]
COUNT: _Kind = (_is_count, "an integer from 0 to 2**63 - 1")
NON_NEGATIVE: _Kind = (_is_non_negative, "a non-negative number")
NUMBER: _Kind = (_is_number, "a number")
STRING: _Kind = (_is_string, "a string")
LIST: _Kind = (_is_list, "a list")
DETAILS: _Kind = (_is_details, "an object of counts and strings")
TOKEN_ID_OR_STRING: _Kind = (
    lambda value: _is_token_id(value) or isinstance(value, str),
    "a token id (an integer from 0 to 2**32 - 1) or a stop string",
)

# Every field of `meta_info` SGLang writes for `/generate`, but `finish_reason` (`FINISH_FIELDS`).
META_FIELDS: dict[str, _Kind] = {
    "id": STRING,  # the request's rid
    "prompt_tokens": COUNT,
    "completion_tokens": COUNT,
    "cached_tokens": COUNT,
    "reasoning_tokens": COUNT,
    "num_retractions": COUNT,
    "weight_version": STRING,
    "weight_versions": LIST,  # [{"version", "start", "end"}], with weight updates mid-request
    "cached_tokens_details": DETAILS,
    "image_tokens": COUNT,
    "audio_tokens": COUNT,
    "video_tokens": COUNT,
    "dp_rank": COUNT,
    "hidden_states": LIST,
    "routed_experts": STRING,  # base64
    "indexer_topk": STRING,  # base64
    "e2e_latency": NON_NEGATIVE,
    # return_logprob
    "input_token_logprobs": LIST,
    "output_token_logprobs": LIST,
    "output_token_logprobs_length": COUNT,
    "input_top_logprobs": LIST,
    "output_top_logprobs": LIST,
    "input_token_ids_logprobs": LIST,
    "output_token_ids_logprobs": LIST,
    # return_sampling_mask
    "output_token_sampling_mask": LIST,
    "output_token_sampling_logprobs": LIST,
    "output_token_sampling_mask_length": COUNT,
    # speculative decoding
    "spec_accept_rate": NON_NEGATIVE,
    "spec_accept_length": NON_NEGATIVE,
    "spec_cap_length": NON_NEGATIVE,
    "spec_block_accept_length": NON_NEGATIVE,
    "spec_num_correct_drafts": COUNT,
    "spec_num_proposed_drafts": COUNT,
    "spec_verify_ct": COUNT,
    "spec_correct_drafts_histogram": LIST,
    "spec_cap_lens_histogram": LIST,
    # --enable-metrics: wall-clock timestamps and durations in seconds
    "request_received_ts": NUMBER,
    "api_server_dispatch_finish_ts": NUMBER,
    "response_sent_to_client_ts": NUMBER,
    "request_finished_ts": NUMBER,
    "first_token_latency": NON_NEGATIVE,
    "decode_throughput": NON_NEGATIVE,
    "forward_entry_time": NUMBER,
    "prefill_finished_time": NUMBER,
    "queue_time": NUMBER,
    "storage_prefetch_wait": NUMBER,
    "storage_staging_wait": NUMBER,
}

# The fields of `meta_info.finish_reason`, but `type` (a string; which ones SGLang writes is the
# record contract's check, `audit.records.contract.FINISH_TYPES`).
FINISH_FIELDS: dict[str, _Kind] = {
    "matched": TOKEN_ID_OR_STRING,  # the stop token's id, or the stop string or regex matched
    "length": COUNT,  # max_new_tokens
    "message": STRING,
    "status_code": COUNT,  # an abort's HTTP status
    "err_type": STRING,
}


def shown(value: Any) -> str:
    """A value for a message: its JSON type and a short excerpt."""
    if value is None:
        return "null"
    text = orjson.dumps(value).decode() if not isinstance(value, float) else repr(value)
    return f"{json_type(value)} {text[:40]}{'…' if len(text) > 40 else ''}"


def _wrong(fields: dict[str, _Kind], value: dict[str, Any], prefix: str) -> str | None:
    for name, item in value.items():
        kind = fields.get(name)
        if kind is not None and item is not None and not kind[0](item):
            return f"{prefix}.{name} must be {kind[1]}, got {shown(item)}"
    return None


def meta_info_problem(meta: Any) -> str | None:
    """What is wrong with a record's `meta_info` (absent is fine), or None. A few dict look-ups
    per field the record has."""
    if meta is None:
        return None
    if not isinstance(meta, dict):
        return f"meta_info must be an object, got {shown(meta)}"
    problem = _wrong(META_FIELDS, meta, "meta_info")
    if problem is not None:
        return problem
    cached, prompt = meta.get("cached_tokens"), meta.get("prompt_tokens")
    if cached is not None and prompt is not None and cached > prompt:
        return (
            f"meta_info.cached_tokens = {cached} is more than meta_info.prompt_tokens = {prompt}: "
            "the server caches only tokens of the prompt"
        )
    return _finish_problem(meta.get("finish_reason"))


def _finish_problem(finish: Any) -> str | None:
    if finish is None:
        return None
    if not isinstance(finish, dict):
        return (
            f"meta_info.finish_reason must be an object like SGLang's "
            f"{{\"type\": \"stop\", ...}}, got {shown(finish)}"
        )
    kind = finish.get("type")
    if kind is None:
        return "meta_info.finish_reason has no type (SGLang writes stop, length or abort)"
    if not isinstance(kind, str):
        text = orjson.dumps(kind).decode()[:40]
        return (
            f"meta_info.finish_reason.type is '{text}' (a JSON {json_type(kind)}), not one SGLang "
            "writes (stop, length, abort)"
        )
    return _wrong(FINISH_FIELDS, finish, "meta_info.finish_reason")
