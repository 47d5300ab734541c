"""The files of a tokenizer directory: which define it, their fingerprint, and loading them.

A tokenizer directory is a local Hugging Face tokenizer (`tokenizer.json`, its config, a chat
template; tiktoken files for Kimi's remote code). Nothing is fetched from a hub. What
`audit.model.tokens.tokenizer.Tokenizer` wraps is loaded here, with a one-line `ConfigError` for every way a
directory can be unusable.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from audit.base.errors import ConfigError

# Files whose bytes define a tokenizer's behaviour; their hash is its fingerprint.
_FINGERPRINT_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "tiktoken.model",
    "tokenizer.model",
    "chat_template.jinja",
    "chat_template.json",
)


@dataclass(frozen=True)
class Fingerprint:
    """What identifies a tokenizer: where it was loaded from, its size and a hash of its files."""

    path: str
    vocab_size: int
    sha256: str

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "vocab_size": self.vocab_size, "sha256": self.sha256}


def fingerprint_directory(directory: Path) -> str:
    """sha256 over the tokenizer files present in `directory`, in a fixed order."""
    digest = hashlib.sha256()
    for name in _FINGERPRINT_FILES:
        path = directory / name
        if path.is_file():
            digest.update(name.encode())
            digest.update(b"\0")
            digest.update(path.read_bytes())
            digest.update(b"\0")
    return digest.hexdigest()


def encode_special_tokens(backend: Any) -> Any:
    """Special-token strings in text encode to their ids, as in the server's own tokenizer (a
    config, or an earlier `split_special_tokens=True` call, may have turned it off)."""
    backend.encode_special_tokens = False
    return backend


def tiktoken_encoding(hf_tokenizer: Any) -> Any:
    """The tiktoken `Encoding` behind a remote-code tokenizer (Kimi's), if there is one."""
    model = getattr(hf_tokenizer, "model", None)
    if model is not None and hasattr(model, "encode_batch") and hasattr(model, "n_vocab"):
        return model
    return None


def _provide_moved_names() -> None:
    """Let remote tokenizer code written for transformers 4 import under transformers 5.

    Kimi's `tokenization_kimi.py` imports `bytes_to_unicode` from the GPT-2 tokenizer module,
    which transformers 5 no longer exports there (it lives in `convert_slow_tokenizer`).
    """
    try:
        from transformers.models.gpt2 import tokenization_gpt2
    except ImportError:
        return
    if not hasattr(tokenization_gpt2, "bytes_to_unicode"):
        from transformers.convert_slow_tokenizer import bytes_to_unicode

        tokenization_gpt2.bytes_to_unicode = bytes_to_unicode  # type: ignore[attr-defined]


def checked_directory(directory: str | Path) -> Path:
    """`directory` as a path, or a ConfigError saying why it is not a tokenizer directory."""
    path = Path(directory).expanduser()
    if path.is_file():
        raise ConfigError(
            f"tokenizer {path} is a file: pass --tokenizer DIR, the directory that holds "
            "tokenizer.json and tokenizer_config.json"
        )
    if path.is_dir() and not any((path / name).is_file() for name in _FINGERPRINT_FILES):
        raise ConfigError(
            f"tokenizer directory {path} holds no tokenizer files (tokenizer.json, "
            "tokenizer_config.json, ...): pass the directory a Hugging Face model's tokenizer was saved to"
        )
    if not path.is_dir():
        raise ConfigError(
            f"tokenizer directory {path} does not exist: pass --tokenizer DIR, a local Hugging "
            "Face tokenizer directory (tokenizer.json, tokenizer_config.json)"
        )
    return path


# The classes a tokenizer_config.json may name for a tokenizer that is its tokenizer.json alone.
_PLAIN_CLASSES = frozenset({"TokenizersBackend", "PreTrainedTokenizerFast"})


def _plain_backend_class(path: Path) -> Any:
    """transformers' `TokenizersBackend` when AutoTokenizer is sure to choose it for `path`, else
    None (then AutoTokenizer chooses).

    AutoTokenizer reads the model's registry of tokenizer classes first (a third of a second,
    most of a first run on a small partition) and asks it about the model's type (`config.json`)
    and any code the tokenizer names (`auto_map`). Without either, a tokenizer_config.json that
    names the plain class, or a Llama class over a byte-level tokenizer.json (which
    transformers loads as the plain class: Llama's own class is Metaspace), leaves it nothing to
    choose. `tests/test_startup.py` checks the two loads agree on every real tokenizer at hand.
    """
    if (path / "config.json").exists() or not (path / "tokenizer.json").is_file():
        return None
    try:
        config = json.loads((path / "tokenizer_config.json").read_bytes())
    except (OSError, ValueError, RecursionError):  # AutoTokenizer says what is wrong with it
        return None
    if not isinstance(config, dict) or "auto_map" in config:
        return None
    declared = config.get("tokenizer_class")
    if not isinstance(declared, str):
        return None
    from transformers.tokenization_utils_tokenizers import TokenizersBackend

    if declared in _PLAIN_CLASSES:
        return TokenizersBackend
    remaps_llama = hasattr(TokenizersBackend, "_tokenizer_json_has_byte_level")
    if declared.removesuffix("Fast") == "LlamaTokenizer" and remaps_llama and _declares_byte_level(path):
        return TokenizersBackend
    return None


def _declares_byte_level(path: Path) -> bool:
    """transformers' `TokenizersBackend._tokenizer_json_has_byte_level` for a local folder: does
    tokenizer.json name "ByteLevel" anywhere. Searched in its bytes (the same answer, the name
    being ASCII): transformers decodes the whole file to text first, ~60 ms of a first load
    under cProfile for a 128k vocabulary."""
    try:
        return b'"ByteLevel"' in (path / "tokenizer.json").read_bytes()
    except OSError:
        return False


def load_with_transformers(path: Path, trust_remote_code: bool) -> Any:
    """The transformers tokenizer in `path`, or a ConfigError saying why it cannot be used."""
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        if trust_remote_code:
            _provide_moved_names()
        backend_class = None if trust_remote_code else _plain_backend_class(path)
        if backend_class is not None:  # what AutoTokenizer would pick, without its model registry
            hf = backend_class.from_pretrained(str(path), local_files_only=True)
        else:
            from transformers import AutoTokenizer

            hf = AutoTokenizer.from_pretrained(
                str(path), trust_remote_code=trust_remote_code, local_files_only=True
            )
    except Exception as exc:  # transformers raises many types; all mean "cannot use this"
        hint = ""
        if not trust_remote_code and (path / "tiktoken.model").exists():
            hint = " (this looks like a tiktoken tokenizer such as Kimi's: add --trust-remote-code)"
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        hint = hint or "; check that its tokenizer.json and tokenizer_config.json are intact"
        raise ConfigError(f"cannot load the tokenizer in {path}: {first_line}{hint}") from exc
    backend = getattr(hf, "backend_tokenizer", None)
    if backend is not None:
        backend.encode_special_tokens = False  # as in Tokenizer: special strings are tokens
    return hf
