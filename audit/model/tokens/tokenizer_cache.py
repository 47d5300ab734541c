"""The loaded state of a tokenizer, kept on disk so that later runs start in a fraction of a second.

Loading a tokenizer through transformers and building the round trip's verified id -> bytes
table cost seconds on a 128k vocabulary, every run: most of what auditing a small partition
takes. The first run does it as before and stores what it found in one file per tokenizer:

* the `tokenizers` backend exactly as transformers built it (serialised, so a later run loads
  it with `tokenizers` alone and never imports transformers unless a chat template is rendered
  or the tokenizer runs its own code),
* the vocabulary facts the rules need (size, which ids exist, special-token strings),
* once a run has needed them (a large audit), the byte table, already verified against the
  tokenizer's own decoder, the backend in the form fastokens loads fastest, and the ids
  `skip_special_tokens` drops.

The first run stores only what it had to find anyway, so a small audit on a fresh machine pays
for nothing it does not use; a later run that builds more stores the state again, with it.

The file is named by a key over everything that decides its content: the tokenizer's files
(their fingerprint, plus `config.json` and any Python code beside them), `trust_remote_code`,
the installed `tokenizers` and transformers, and this layout. It is written to a temporary
file and renamed into place (concurrent writers each rename a whole file), and carries a
sha256 of its body that is checked on every read: a truncated, corrupted or foreign file is
ignored and rebuilt. Where: `$AUDIT_CACHE_DIR/tokenizers/`, else `~/.cache/audit/tokenizers/`
(`$XDG_CACHE_HOME` respected). Deleting it is always safe; a cache that cannot be written is
skipped.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import struct
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from audit.base.files import open_temporary
from audit.model.tokens.fastcodec import ByteDecoder

CACHE_DIR_ENV = "AUDIT_CACHE_DIR"
_MAGIC = b"audit-tokenizer-state\n"
# Bumped whenever what is stored, or how the table is verified, changes.
_LAYOUT = 2
_DIGEST_BYTES = 64  # sha256 as hex
_HEADER_LENGTH = struct.Struct("<Q")
# Besides the fingerprinted tokenizer files, what can change what transformers builds.
_EXTRA_KEY_FILES = ("config.json",)


def cache_dir() -> Path:
    """`$AUDIT_CACHE_DIR/tokenizers`, else the user's cache directory (`~/.cache/audit/tokenizers`)."""
    root = os.environ.get(CACHE_DIR_ENV)
    if root:
        return Path(root) / "tokenizers"
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "audit" / "tokenizers"


@dataclass
class TokenizerState:
    """What a run needs of a tokenizer besides its encoder: stored and read back as one file."""

    kind: str  # "backend": `backend_json` is the whole tokenizer; "remote": load it with its code
    vocab_size: int
    special_token_strings: tuple[str, ...]
    has_chat_template: bool
    known: np.ndarray  # bool per id below vocab_size: does the tokenizer have it?
    backend_json: str | None = None
    table: np.ndarray | None = None  # the byte table's bytes (uint8), when it is byte-level
    lengths: np.ndarray | None = None  # byte length of each id's piece (int64)
    decoder_known: np.ndarray | None = None  # bool per table entry: does it have a piece?
    extra: dict[str, Any] = field(default_factory=dict)

    # -- (de)serialising ---------------------------------------------------------------------------
    def to_bytes(self) -> bytes:
        sections: list[tuple[str, bytes, str]] = [("known", np.packbits(self.known).tobytes(), "bits")]
        if self.backend_json is not None:
            sections.append(("backend", self.backend_json.encode("utf-8"), "utf-8"))
        if self.table is not None and self.lengths is not None and self.decoder_known is not None:
            sections.append(("table", self.table.astype(np.uint8, copy=False).tobytes(), "uint8"))
            sections.append(("lengths", self.lengths.astype("<i8", copy=False).tobytes(), "<i8"))
            sections.append(("decoder_known", np.packbits(self.decoder_known).tobytes(), "bits"))
        offset = 0
        layout = []
        for name, data, dtype in sections:
            layout.append([name, offset, len(data), dtype])
            offset += len(data)
        header = json.dumps(
            {
                "layout": _LAYOUT,
                "kind": self.kind,
                "vocab_size": self.vocab_size,
                "special_token_strings": list(self.special_token_strings),
                "has_chat_template": self.has_chat_template,
                "extra": self.extra,
                "sections": layout,
            }
        ).encode()
        body = _HEADER_LENGTH.pack(len(header)) + header + b"".join(data for _, data, _ in sections)
        return _MAGIC + hashlib.sha256(body).hexdigest().encode() + body

    @classmethod
    def from_bytes(cls, raw: bytes) -> TokenizerState | None:
        """The state stored in `raw`, or None when it is not a whole, intact file of this layout."""
        start = len(_MAGIC) + _DIGEST_BYTES
        if len(raw) < start + _HEADER_LENGTH.size or not raw.startswith(_MAGIC):
            return None
        body = memoryview(raw)[start:]
        if hashlib.sha256(body).hexdigest().encode() != raw[len(_MAGIC) : start]:
            return None
        try:
            (header_length,) = _HEADER_LENGTH.unpack_from(body)
            payload_at = _HEADER_LENGTH.size + header_length
            header = json.loads(bytes(body[_HEADER_LENGTH.size : payload_at]))
            if header.get("layout") != _LAYOUT:
                return None
            sections = {
                name: body[payload_at + offset : payload_at + offset + length]
                for name, offset, length, _ in header["sections"]
            }
            size = int(header["vocab_size"])
            known = np.unpackbits(np.frombuffer(sections["known"], dtype=np.uint8), count=size).astype(bool)
            backend = sections.get("backend")
            table, raw_lengths = sections.get("table"), sections.get("lengths")
            decoder_known = lengths = None
            if table is not None and raw_lengths is not None:
                lengths = np.frombuffer(raw_lengths, dtype="<i8").astype(np.int64)
                bits = np.frombuffer(sections["decoder_known"], dtype=np.uint8)
                decoder_known = np.unpackbits(bits, count=len(lengths)).astype(bool)
                if int(lengths.sum()) != len(table):
                    return None
            return cls(
                kind=str(header["kind"]),
                vocab_size=size,
                special_token_strings=tuple(header["special_token_strings"]),
                has_chat_template=bool(header["has_chat_template"]),
                known=known,
                backend_json=None if backend is None else str(backend, "utf-8"),
                table=None if decoder_known is None or table is None else np.frombuffer(table, dtype=np.uint8),
                lengths=None if decoder_known is None else lengths,
                decoder_known=decoder_known,
                extra=dict(header.get("extra") or {}),
            )
        except (ValueError, KeyError, TypeError, struct.error):
            return None

    def byte_decoder(self) -> ByteDecoder | None:
        """The stored byte table (verified when it was built), or None when there is none."""
        if self.table is None or self.lengths is None or self.decoder_known is None:
            return None
        return ByteDecoder.from_arrays(self.table, self.lengths, self.decoder_known)


class StoredVocabulary:
    """What the `tokenizers` backend answers about ids, read from its serialized JSON.

    The skipped ids: those `decode(skip_special_tokens=True)` drops, whose token (added tokens
    first, then the model's) is the content of an added token marked special, as the backend
    tests each id's token. Found when the state is first stored (`skipped_of` the backend the
    first load built; `skipped_in` its JSON for a state stored without them) and kept in it, so
    a run knows them without reading the JSON (`skipped`). `token_ids`: a token's id as
    `token_to_id` finds it (added tokens over the model's vocabulary), read from the JSON on
    first use only: as a dict a 128k vocabulary holds ~17 MB, which a large audit (whose
    look-ups are remembered, `RememberedAnswers`) never needs.
    """

    def __init__(self, backend_json: str, skipped_ids: Iterable[int]):
        self._backend_json = backend_json
        skipped = np.fromiter(skipped_ids, dtype=np.int64)
        self._skipped = np.zeros(int(skipped.max(initial=0)) + 1, dtype=bool)
        self._skipped[skipped] = True

    @staticmethod
    def skipped_in(backend_json: str) -> list[int] | None:
        """The skipped ids of a serialized backend, or None when its vocabulary is not a token ->
        id map (a Unigram model's list: the backend itself answers then)."""
        read = _read_vocabulary(backend_json)
        return None if read is None else sorted(read[1])

    @staticmethod
    def skipped_of(backend: Any) -> list[int] | None:
        """The skipped ids of a built backend, as `skipped_in` finds them in its JSON (found by
        the first load, which holds the backend: a few hundred look-ups, where reading the JSON
        again builds the whole vocabulary). None when its model's vocabulary is not a token -> id
        map (Unigram's is a list)."""
        if type(backend.model).__name__ not in ("BPE", "WordPiece", "WordLevel"):
            return None
        added = backend.get_added_tokens_decoder()
        special = {token.content for token in added.values() if token.special}
        skipped = {token_id for token_id, token in added.items() if token.content in special}
        for content in special:
            token_id = backend.model.token_to_id(content)
            if token_id is not None and token_id not in added:
                skipped.add(token_id)
        return sorted(skipped)

    @cached_property
    def token_ids(self) -> dict[str, int]:
        read = _read_vocabulary(self._backend_json)
        return {} if read is None else read[0]

    def skipped(self, ids: np.ndarray) -> np.ndarray:
        """Per id: does `skip_special_tokens` drop it? (vectorised; ids outside the vocabulary
        are not skipped)"""
        inside = (ids >= 0) & (ids < len(self._skipped))
        return inside & self._skipped[np.where(inside, ids, 0)]


def _read_vocabulary(backend_json: str) -> tuple[dict[str, int], set[int]] | None:
    import orjson

    data = orjson.loads(backend_json)
    vocab = (data.get("model") or {}).get("vocab")
    if not isinstance(vocab, dict):
        return None
    added = data.get("added_tokens") or []
    token_ids = dict(vocab)
    token_ids.update((token["content"], token["id"]) for token in added)
    special = {token["content"] for token in added if token.get("special")}
    added_ids = {token["id"] for token in added}
    skipped = {token["id"] for token in added if token["content"] in special}
    skipped.update(i for token, i in vocab.items() if token in special and i not in added_ids)
    return token_ids, skipped


def compact_backend_json(text: str) -> str | None:
    """A serialised backend with its BPE merges written as "a b" strings (no piece holding a
    space): the same tokenizer (checked: it serialises back identically), a quarter faster for
    fastokens to load. None when it has no such merges or does not read back the same."""
    import orjson
    import tokenizers

    data = orjson.loads(text)
    model = data.get("model") or {}
    merges = model.get("merges")
    if model.get("type") != "BPE" or not isinstance(merges, list) or not merges:
        return None
    if all(isinstance(m, str) for m in merges):
        return text  # already so
    if not all(isinstance(m, list) and len(m) == 2 and " " not in m[0] and " " not in m[1] for m in merges):
        return None
    model["merges"] = [f"{a} {b}" for a, b in merges]
    compact = orjson.dumps(data).decode()
    try:
        same = tokenizers.Tokenizer.from_str(compact).to_str() == text
    except Exception:  # not readable back: keep the original form
        same = False
    return compact if same else None


# -- the key -----------------------------------------------------------------------------------------


def _installed(module: str) -> str:
    """Where a package is installed and when it was written: changes when it is upgraded.

    (Cheaper than importing transformers or reading package metadata, which is the point.)
    """
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        return f"{module}: absent"
    stat = os.stat(spec.origin)
    return f"{module}: {spec.origin} {stat.st_size} {stat.st_mtime_ns}"


def state_key(directory: Path, fingerprint_sha256: str, *, trust_remote_code: bool) -> str:
    """The name of the cached state of the tokenizer in `directory`, loaded this way, here."""
    import tokenizers

    digest = hashlib.sha256(f"layout {_LAYOUT}\0{fingerprint_sha256}\0trust {trust_remote_code}\0".encode())
    digest.update(f"tokenizers {tokenizers.__version__}\0{_installed('transformers')}\0".encode())
    extra = [directory / name for name in _EXTRA_KEY_FILES]
    extra += sorted(directory.glob("*.py"))  # a remote-code tokenizer's own code
    for path in extra:
        if path.is_file():
            digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


# -- the store ---------------------------------------------------------------------------------------


def load_state(key: str) -> TokenizerState | None:
    """The stored state for `key`, or None (never raises: a broken or missing file is a miss)."""
    try:
        raw = (cache_dir() / f"{key}.bin").read_bytes()
    except OSError:
        return None
    return TokenizerState.from_bytes(raw)


def store_state(key: str, state: TokenizerState) -> None:
    """Keep `state` under `key`: written beside its place and renamed in; skipped when unwritable."""
    path = cache_dir() / f"{key}.bin"
    temporary = None
    try:
        temporary = open_temporary(path.parent, path.name)
        temporary.file.write(state.to_bytes())
        # A cache need not survive a power cut (a damaged file fails its checksum and is rebuilt).
        temporary.commit(path, sync_directory=False)
    except OSError:
        if temporary is not None:
            temporary.discard()


# -- answers remembered between runs -----------------------------------------------------------------


class RememberedAnswers:
    """A few answers of the tokenizer kept beside its state: the ids of the short texts a profile
    encodes (its generation-prompt endings) and of the tokens it looks up.

    Preparing an audit asks only these; remembered, a later run prepares without building an
    encoder at all: a result taken from the result cache, or a large audit (whose encoder is
    fastokens, built before the first block), never builds the `tokenizers` backend. Kept in
    `<key>.answers.json`, keyed like the state (the same tokenizer, the same libraries), with a
    sha256 of its body: a damaged file is ignored and written again; one that cannot be written
    costs speed only.
    """

    def __init__(self, key: str):
        self._path = cache_dir() / f"{key}.answers.json"
        self._loaded: dict[str, dict[str, Any]] | None = None

    def _answers(self) -> dict[str, dict[str, Any]]:
        if self._loaded is None:
            self._loaded = {"encode": {}, "token_id": {}}
            try:
                stored = json.loads(self._path.read_bytes())
                body = json.dumps(stored["answers"], sort_keys=True)
                if hashlib.sha256(body.encode()).hexdigest() == stored["sha256"]:
                    self._loaded.update({k: dict(stored["answers"][k]) for k in ("encode", "token_id")})
            except (OSError, ValueError, KeyError, TypeError):
                pass  # none yet, or damaged: answered afresh and written again
        return self._loaded

    def encodings(self, texts: list[str]) -> list[list[int]] | None:
        """The remembered ids of every text, or None when one is not remembered."""
        known = self._answers()["encode"]
        return [list(known[t]) for t in texts] if all(t in known for t in texts) else None

    def token_id(self, token: str) -> tuple[bool, int | None]:
        """(remembered?, the id or None)."""
        known = self._answers()["token_id"]
        return (token in known, known.get(token))

    def remember(self, kind: str, answers: dict[str, Any]) -> None:
        """Keep new answers (`kind` "encode" or "token_id") and write the file again."""
        table = self._answers()[kind]
        if all(table.get(k, object()) == v for k, v in answers.items()):
            return
        table.update(answers)
        body = json.dumps(self._loaded, sort_keys=True)
        temporary = None
        try:
            temporary = open_temporary(self._path.parent, self._path.name)
            digest = hashlib.sha256(body.encode()).hexdigest()
            temporary.file.write(json.dumps({"sha256": digest, "answers": self._loaded}).encode())
            temporary.commit(self._path, sync_directory=False)
        except OSError:
            if temporary is not None:
                temporary.discard()
