"""Build a tiktoken-based tokenizer directory loaded through remote code, like Kimi's.

Kimi ships `tiktoken.model` (base64 token, rank per line), a `tokenizer_config.json` whose
`auto_map` points at its own tokenizer class, and that class's module. This builds the same
shape with 163,584 ordinary ranks, so the special tokens land at Kimi's real ids
(163584 onwards), and a small tokenizer class written for these tests. The class imports
`bytes_to_unicode` from where transformers 4 kept it, as real remote code does.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

BASE_TOKENS = 163_584
SPECIALS = {
    163584: "[BOS]",
    163585: "[EOS]",
    163586: "<|im_end|>",
    163587: "<|im_user|>",
    163588: "<|im_assistant|>",
    163594: "<|im_system|>",
    163595: "<|tool_calls_section_begin|>",
    163596: "<|tool_calls_section_end|>",
    163597: "<|tool_call_begin|>",
    163598: "<|tool_call_argument_begin|>",
    163599: "<|tool_call_end|>",
    163601: "<|im_middle|>",
    163606: "<think>",
    163607: "</think>",
    163838: "[UNK]",
    163839: "[PAD]",
}

TOKENIZER_MODULE = '''
from pathlib import Path

import tiktoken
from tiktoken.load import load_tiktoken_bpe
from transformers.models.gpt2.tokenization_gpt2 import bytes_to_unicode
from transformers.tokenization_utils import PreTrainedTokenizer

PATTERN = r"""[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"""


class TinyTikTokenTokenizer(PreTrainedTokenizer):
    vocab_files_names = {"vocab_file": "tiktoken.model"}
    model_input_names = ["input_ids", "attention_mask"]

    def __init__(self, vocab_file, added_tokens_decoder=None, **kwargs):
        ranks = load_tiktoken_bpe(vocab_file)
        names = {i: t.content for i, t in (added_tokens_decoder or {}).items()}
        specials = {names.get(i, f"<|reserved_token_{i}|>"): i for i in range(len(ranks), len(ranks) + 258)}
        self.model = tiktoken.Encoding(name=Path(vocab_file).name, pat_str=PATTERN,
                                       mergeable_ranks=ranks, special_tokens=specials)
        to_text = bytes_to_unicode()
        self.decoder = {i: "".join(to_text[b] for b in self.model.decode_single_token_bytes(i))
                        for i in range(self.model.n_vocab)}
        self.encoder = {text: i for i, text in self.decoder.items()}
        self.from_text = {v: k for k, v in to_text.items()}
        super().__init__(**kwargs)

    @property
    def vocab_size(self):
        return self.model.n_vocab

    def get_vocab(self):
        return dict(self.encoder)

    def _tokenize(self, text, **kwargs):
        return [self.decoder[i] for i in self.model.encode(text, allowed_special="all")]

    def _convert_token_to_id(self, token):
        return self.encoder.get(token)

    def _convert_id_to_token(self, index):
        return self.decoder.get(index)

    def convert_tokens_to_string(self, tokens):
        return bytes(self.from_text[c] for c in "".join(tokens)).decode("utf-8", "replace")
'''

CHAT_TEMPLATE = (
    "{%- for m in messages -%}"
    "{%- if m.role == 'user' -%}<|im_user|>user<|im_middle|>{{ m.content }}<|im_end|>"
    "{%- elif m.role == 'system' -%}<|im_system|>system<|im_middle|>{{ m.content }}<|im_end|>"
    "{%- endif -%}{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|im_assistant|>assistant<|im_middle|>"
    "{%- if thinking is defined and thinking is false -%}<think></think>{%- else -%}<think>{%- endif -%}"
    "{%- endif -%}"
)


def _ordinary_tokens() -> list[bytes]:
    """256 single bytes, every printable ASCII pair, then printable triples up to the count."""
    tokens = [bytes([b]) for b in range(256)]
    printable = range(32, 127)
    tokens += [bytes([a, b]) for a in printable for b in printable]
    for a in b" etaoinshrdlucmfwyp":
        for b in printable:
            for c in printable:
                if len(tokens) == BASE_TOKENS:
                    return tokens
                tokens.append(bytes([a, b, c]))
    return tokens


def build(directory: Path) -> Path:
    """Write the tokenizer directory and return it."""
    directory.mkdir(parents=True, exist_ok=True)
    lines = (f"{base64.b64encode(t).decode()} {rank}\n" for rank, t in enumerate(_ordinary_tokens()))
    (directory / "tiktoken.model").write_text("".join(lines))
    (directory / "tokenization_tiny.py").write_text(TOKENIZER_MODULE)
    config = {
        "auto_map": {"AutoTokenizer": ["tokenization_tiny.TinyTikTokenTokenizer", None]},
        "tokenizer_class": "TinyTikTokenTokenizer",
        "added_tokens_decoder": {
            str(i): {"content": t, "special": True, "normalized": False, "lstrip": False,
                     "rstrip": False, "single_word": False}
            for i, t in SPECIALS.items()
        },
        "bos_token": "[BOS]",
        "eos_token": "[EOS]",
        "unk_token": "[UNK]",
        "pad_token": "[PAD]",
        "chat_template": CHAT_TEMPLATE,
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return directory
