"""How a trainer's pinned transformers loads a tokenizer folder, where it differs from the folder.

The audit reads a folder's `tokenizer.json` itself. A trainer calls `AutoTokenizer.
from_pretrained` under the transformers it pins, and some releases build another tokenizer from
the same folder: transformers 5.8.1 (SpecForge 0.2.0's pin) turns a folder whose
`tokenizer_config.json` names `LlamaTokenizerFast` over a byte-level BPE `tokenizer.json`
(DeepSeek-V3.2, R1-0528 and other DeepSeek-format folders), with no `config.json` model type it
maps to its own tokenizer, into a Llama tokenizer with a Metaspace pre-tokenizer: spaces vanish,
text outside its pieces is lost (transformers #45488, #48206). A trainer's rules file says so as
data (`[transformers]`, `[[transformers.loads]]`: which folders, and the pipeline they get), and
`trainer_encoder` builds that pipeline from the folder's own vocabulary and merges, so the
trainer view encodes as the trainer would.

Without a trainer, the same happens wherever the folder is loaded by `AutoTokenizer` (SGLang, a
user's own code): `installed_load` decides, once per folder and transformers release (the
tokenizer cache keeps the answer, `audit.model.tokens.tokenizer.Tokenizer.installed_load`), whether
the installed transformers encodes the folder otherwise than its `tokenizer.json`.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from audit.base.config import expect, reject_unknown, string_list
from audit.base.errors import ConfigError
from audit.model.tokens.flat_ids import FlatIds

# The parts of a tokenizer.json a load rule may set, as the loaded tokenizer has them.
_PIPELINE_KEYS = ("normalizer", "pre_tokenizer", "decoder", "post_processor")


@dataclass(frozen=True, eq=False)
class LoadRule:
    """One kind of folder the trainer's transformers loads otherwise, and what it builds."""

    tokenizer_classes: tuple[str, ...]  # tokenizer_config.json's tokenizer_class
    pre_tokenizer: str  # the folder's tokenizer.json pre-tokenizer type (within a Sequence too)
    # config.json model types that make transformers load the folder's own tokenizer.json ("": none)
    loaded_by_model_type: tuple[str, ...]
    builds: str  # what it builds, as a finding names it
    pipeline: dict[str, Any]  # tokenizer.json parts replaced (null: removed)
    model: dict[str, Any]  # model keys replaced
    fix: str

    def matches(self, folder: FolderFacts) -> bool:
        return (
            folder.tokenizer_class in self.tokenizer_classes
            and self.pre_tokenizer in folder.pre_tokenizers
            and folder.model_type not in self.loaded_by_model_type
        )


@dataclass(frozen=True)
class TokenizerLoading:
    """A trainer's pinned transformers and the folders it loads otherwise than their tokenizer.json."""

    transformers: str
    cited: str
    loads: tuple[LoadRule, ...]


@dataclass(frozen=True)
class FolderFacts:
    """What decides how transformers loads a tokenizer folder."""

    tokenizer_class: str
    model_type: str  # "" without a config.json or a model_type in it
    pre_tokenizers: tuple[str, ...]


def parse_loading(table: Any, where: str) -> TokenizerLoading | None:
    """The `[transformers]` table of a trainer's rules file (None when it has none)."""
    if table is None:
        return None
    at = f"{where}: [transformers]"
    reject_unknown(expect(table, dict, at), {"version", "cited", "loads"}, at)
    loads = []
    for index, rule in enumerate(expect(table.get("loads", []), list, f"{at}.loads")):
        here = f"{at}.loads[{index}]"
        keys = {"tokenizer_class", "pre_tokenizer", "loaded_by_model_type", "builds", "pipeline", "model", "fix"}
        reject_unknown(expect(rule, dict, here), keys, here)
        pipeline = {key: json.loads(value) for key, value in expect(rule.get("pipeline", {}), dict, f"{here}.pipeline").items()}
        unknown = sorted(set(pipeline) - set(_PIPELINE_KEYS))
        if unknown:
            raise ConfigError(f"{here}.pipeline: {unknown[0]!r} is not a part of a tokenizer.json ({', '.join(_PIPELINE_KEYS)})")
        loads.append(
            LoadRule(
                tokenizer_classes=tuple(string_list(rule.get("tokenizer_class"), f"{here}.tokenizer_class")),
                pre_tokenizer=expect(rule.get("pre_tokenizer"), str, f"{here}.pre_tokenizer"),
                loaded_by_model_type=tuple(string_list(rule.get("loaded_by_model_type", []), f"{here}.loaded_by_model_type")),
                builds=expect(rule.get("builds"), str, f"{here}.builds"),
                pipeline=pipeline,
                model=dict(expect(rule.get("model", {}), dict, f"{here}.model")),
                fix=expect(rule.get("fix"), str, f"{here}.fix"),
            )
        )
    return TokenizerLoading(
        transformers=expect(table.get("version"), str, f"{at}.version"),
        cited=expect(table.get("cited", ""), str, f"{at}.cited"),
        loads=tuple(loads),
    )


def folder_facts(directory: Path) -> tuple[FolderFacts, dict[str, Any]] | None:
    """The folder's declared class, model type and pre-tokenizer, with its parsed tokenizer.json;
    None without one (a tiktoken or remote-code folder: no load rule is about it)."""
    try:
        backend = json.loads((directory / "tokenizer.json").read_text(encoding="utf-8"))
        config = _json_object(directory / "tokenizer_config.json")
        model = _json_object(directory / "config.json")
    except (OSError, ValueError):
        return None
    if not isinstance(backend, dict) or not isinstance(backend.get("model"), dict):
        return None
    facts = FolderFacts(
        tokenizer_class=str(config.get("tokenizer_class") or ""),
        model_type=str(model.get("model_type") or ""),
        pre_tokenizers=_types(backend.get("pre_tokenizer")),
    )
    return facts, backend


def _json_object(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    value = json.loads(path.read_text(encoding="utf-8"))
    return value if isinstance(value, dict) else {}


def _types(part: Any) -> tuple[str, ...]:
    """The types of a pipeline part, a Sequence's members included."""
    if not isinstance(part, dict):
        return ()
    members = part.get("pretokenizers") or part.get("pre_tokenizers") or []
    return (str(part.get("type")), *(t for member in members for t in _types(member)))


@dataclass
class TrainerEncoder:
    """The tokenizer the trainer's transformers builds from a folder, for its encodes."""

    rule: LoadRule
    transformers: str
    backend: Any  # tokenizers.Tokenizer

    def encode_flat(self, texts: list[str]) -> FlatIds:
        """Each text's ids as the trainer encodes it (`add_special_tokens=False`, as SpecForge)."""
        return FlatIds.from_sequences([e.ids for e in self.backend.encode_batch(texts, add_special_tokens=False)])

    @property
    def cause(self) -> str:
        """One sentence: why the trainer's ids are not the folder's, and the fix."""
        return (
            f"its transformers {self.transformers} loads this tokenizer folder as {self.rule.builds} "
            f"(fix: {self.rule.fix})"
        )


# Decided (and built) once per folder and transformers release in a process: every batch of a
# run asks, and a real tokenizer.json is megabytes of JSON to read.
_DECIDED: dict[tuple[Path, str], TrainerEncoder | None] = {}


def trainer_encoder(loading: TokenizerLoading | None, directory: Path) -> TrainerEncoder | None:
    """The encoder of the tokenizer `loading`'s transformers builds from `directory`, where a
    load rule says it differs from the folder's tokenizer.json; else None (the folder's own)."""
    if loading is None:
        return None
    key = (directory, loading.transformers)
    if key not in _DECIDED:
        _DECIDED[key] = _build(loading, directory)
    return _DECIDED[key]


def _build(loading: TokenizerLoading, directory: Path) -> TrainerEncoder | None:
    read = folder_facts(directory)
    if read is None:
        return None
    facts, backend = read
    rule = next((r for r in loading.loads if r.matches(facts)), None)
    if rule is None:
        return None
    import tokenizers

    backend.update(rule.pipeline)
    backend["model"] = {**backend["model"], **rule.model}
    return TrainerEncoder(rule, loading.transformers, tokenizers.Tokenizer.from_str(json.dumps(backend)))


# Texts whose ids show a load that differs from the folder's tokenizer.json: spaces, tabs and
# newlines (a Metaspace load drops them), CJK and emoji (outside a Llama vocabulary's pieces),
# digits and code (pre-tokenizer splits).
_PROBES = (
    "You are a helpful assistant.",
    "你好，世界！\n\tTabs  and  spaces ",
    "émigré 🙂 123 4567",
    "def f(x):\n    return {'a': [1, 2]}",
    " leading",
    "trailing \n\n",
)
# What every transformers release loads as the folder's tokenizer.json itself (4.x: the fast
# class over tokenizer.json; 5.x: an alias of TokenizersBackend).
_PLAIN_FIX = 'write "tokenizer_class": "PreTrainedTokenizerFast" in its tokenizer_config.json'
# The model settings that change how a BPE/WordPiece/Unigram model encodes.
_MODEL_SETTINGS = ("byte_fallback", "fuse_unk", "unk_token", "continuing_subword_prefix", "end_of_word_suffix",
                   "dropout", "ignore_merges")


def installed_load(directory: Path, loaded: Any, loaded_class: str, transformers: str) -> dict[str, str] | None:
    """How the installed transformers' AutoTokenizer (`loaded`: its `tokenizers` backend, of
    class `loaded_class`) encodes the folder otherwise than the folder's tokenizer.json: the
    class it built, a text and what its ids read back as, and the fix; None when they encode
    alike (or the folder has no tokenizer.json).

    The pipeline parts and the vocabulary are compared first (no second tokenizer is built when
    they agree, as they do for almost every folder: a quarter of a second for a 128k vocabulary,
    once); where they differ, probe texts decide.
    """
    import orjson

    try:
        raw = (directory / "tokenizer.json").read_bytes()
        own = orjson.loads(raw)
    except (OSError, ValueError):
        return None
    if not isinstance(own, dict) or not isinstance(own.get("model"), dict) or _same_pipeline(own, loaded):
        return None
    import tokenizers

    try:
        folder = tokenizers.Tokenizer.from_str(raw.decode("utf-8"))
    except Exception:  # a tokenizer.json this tokenizers cannot read: the load is all there is
        return None
    folder.encode_special_tokens = False
    added = [token.content for token in folder.get_added_tokens_decoder().values()][:8]
    probes = [*_PROBES, *(f"x{token}y {token} z" for token in added)]
    theirs = loaded.encode_batch(probes, add_special_tokens=False)
    ours = folder.encode_batch(probes, add_special_tokens=False)
    differ = [i for i, (a, b) in enumerate(zip(theirs, ours, strict=True)) if a.ids != b.ids]
    if not differ:
        return None
    text = probes[differ[0]]
    declared = folder_facts(directory)
    return {
        "transformers": transformers,
        "declared": declared[0].tokenizer_class if declared is not None else "",
        "loads_as": loaded_class,
        "text": text,
        "reads": loaded.decode(theirs[differ[0]].ids, skip_special_tokens=False),
        "ids": str(len(theirs[differ[0]].ids)),
        "folder_ids": str(len(ours[differ[0]].ids)),
        "fix": _PLAIN_FIX,
    }


def _same_pipeline(own: dict[str, Any], loaded: Any) -> bool:
    """Do the folder's tokenizer.json (parsed) and the loaded backend encode by the same parts:
    normalizer, pre-tokenizer, model type and settings, vocabulary and added tokens?"""
    for part in ("normalizer", "pre_tokenizer"):
        component = getattr(loaded, part)
        state = None if component is None else json.loads(component.__getstate__())
        if state != own.get(part):
            return False
    model, settings = loaded.model, own["model"]
    if type(model).__name__ != settings.get("type"):
        return False
    for name in _MODEL_SETTINGS:
        if name in settings and hasattr(model, name) and getattr(model, name) != settings[name]:
            return False
    # The vocabulary by every 97th entry and its last id (reading the loaded one whole costs
    # more than the rest of the decision: a load that changes it changes far more than that).
    vocab = settings.get("vocab")
    if isinstance(vocab, list) and vocab and all(isinstance(entry, list) and entry for entry in vocab[:1]):
        vocab = {entry[0]: index for index, entry in enumerate(vocab)}  # Unigram: [piece, score] by id
    if not isinstance(vocab, dict) or not vocab:
        return False
    last = max(vocab.values())
    sample = itertools.islice(vocab.items(), 0, None, 97)
    if any(model.token_to_id(token) != token_id for token, token_id in sample) or (
        model.id_to_token(last + 1) is not None or model.id_to_token(last) is None
    ):
        return False
    added = {
        token_id: (token.content, token.lstrip, token.rstrip, token.single_word, token.normalized)
        for token_id, token in loaded.get_added_tokens_decoder().items()
    }
    flags = (("lstrip", False), ("rstrip", False), ("single_word", False), ("normalized", True))
    return added == {
        token.get("id"): (token.get("content"), *(token.get(name, default) for name, default in flags))
        for token in own.get("added_tokens") or []
        if isinstance(token, dict)
    }


def installed_load_warning(load: dict[str, str]) -> str:
    """One sentence for the run's summary: the installed transformers loads the folder otherwise."""
    text, reads = load.get("text", ""), load.get("reads", "")
    shown = f" (reads back as {reads!r})" if reads != text else ""
    declared = f", where its tokenizer_config.json names {load['declared']}" if load.get("declared") else ""
    return (
        f"transformers {load.get('transformers')} (installed) loads this tokenizer folder as {load.get('loads_as')}"
        f"{declared}, which encodes otherwise than its tokenizer.json: {text!r} is {load.get('ids')} ids there, "
        f"{load.get('folder_ids')} by tokenizer.json{shown}; its ids depend on how it is loaded (AutoTokenizer "
        f"under this release, as this audit and SGLang load it, or its tokenizer.json, as other releases and the "
        f"tokenizers library read it) (fix: {load.get('fix')})"
    )
