"""Tokenizer: encode/decode with the `tokenizers` library, chat templates, streaming detokenizing.

Every model form (HF directory, GGUF, synthetic) ends up as one `tokenizers.Tokenizer` plus a
little metadata (EOS/BOS ids, special token strings, chat template), so there is one code path.
"""

from __future__ import annotations

import json
from pathlib import Path

import jinja2
from tokenizers import AddedToken, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

from backend.chat_template import (
    ChatTemplateError,
    ChatTemplateMissing,
    compile_template,
    render_chat_template,
)
from backend.schema import Schema

__all__ = ["Tokenizer", "IncrementalDetokenizer", "ChatTemplateMissing", "ChatTemplateError",
           "TokenizerMeta", "byte_level_tokenizer", "CHATML_TEMPLATE"]

_REPLACEMENT = "\ufffd"

# Used by synthetic models; the same shape SmolLM2/Qwen use, so prompts look realistic.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


class TokenizerMeta(Schema):
    """What a `tokenizers.Tokenizer` does not carry itself."""

    eos_token_ids: tuple[int, ...]
    bos_token_id: int | None = None
    add_bos_token: bool = False  # whether the model was trained with BOS before raw prompts
    chat_template: str | None = None
    special_tokens: dict[str, str | None] = {}  # bos_token, eos_token...

    def to_dict(self) -> dict:
        return {"eos_token_ids": list(self.eos_token_ids), "bos_token_id": self.bos_token_id,
                "add_bos_token": self.add_bos_token, "chat_template": self.chat_template,
                "special_tokens": dict(self.special_tokens)}

    @classmethod
    def from_dict(cls, d: dict) -> TokenizerMeta:
        return cls.model_validate(d)


class IncrementalDetokenizer:
    """Turns a stream of token ids into text deltas.

    Decodes a short window (the previous delta's tokens plus the new ones) and emits what the new
    tokens add. Decoding with context is what makes leading spaces right (SentencePiece drops a
    leading space at the start of a decode; byte-level BPE tokens may split a character). Text
    ending in U+FFFD is held back until the next token completes the character.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = True) -> None:
        self._tok = tokenizer
        self._skip = skip_special_tokens
        self._ids: list[int] = []
        self._prefix_offset = 0  # start of the context window
        self._read_offset = 0    # tokens before this were already emitted

    def push(self, token_id: int) -> str:
        """Add one token; return the new text (may be "" while a character is incomplete)."""
        self._ids.append(int(token_id))
        return self._emit(final=False)

    def flush(self) -> str:
        """Emit whatever is held back (an incomplete character becomes U+FFFD)."""
        return self._emit(final=True)

    def _emit(self, final: bool) -> str:
        decode, start, read = self._tok.decode, self._prefix_offset, self._read_offset
        prefix_text = self._tok.decode_one(self._ids[start], self._skip) \
            if read - start == 1 else decode(self._ids[start:read], self._skip)
        new_text = decode(self._ids[start:], self._skip)
        if not final:
            if len(new_text) <= len(prefix_text):
                return ""  # e.g. a skipped special token: nothing visible yet
            # A character needs at most 4 byte-tokens; past that the bytes are truly invalid
            # (a random model), so emit the replacement character rather than stall the stream.
            if new_text.endswith(_REPLACEMENT) and len(self._ids) - self._read_offset < 4:
                return ""
        delta = new_text[len(prefix_text):]
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._ids)
        return delta


class Tokenizer:
    """The interface the server and engine use (see docs/ARCHITECTURE.md)."""

    def __init__(self, backend: HFTokenizer, meta: TokenizerMeta) -> None:
        self.backend = backend
        self.meta = meta
        self.eos_token_ids: tuple[int, ...] = tuple(meta.eos_token_ids)
        self.bos_token_id: int | None = meta.bos_token_id
        self.add_bos_token: bool = meta.add_bos_token
        self.chat_template: str | None = meta.chat_template
        self.vocab_size: int = backend.get_vocab_size(with_added_tokens=True)
        # (token id, skip_special_tokens) -> its text alone; at most two per vocabulary entry
        self._one: dict[tuple[int, bool], str] = {}
        # Compiled once here; a template that does not compile fails each chat request with
        # its message (completions still work), rather than the whole model load.
        self._template: jinja2.Template | ChatTemplateError | None = None
        if meta.chat_template:
            try:
                self._template = compile_template(meta.chat_template)
            except ChatTemplateError as exc:
                self._template = exc

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`; special tokens written in the text (e.g. from a chat template)
        are recognised, none are added."""
        return self.backend.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.backend.decode(ids if type(ids) is list else list(ids),
                                   skip_special_tokens=skip_special_tokens)

    def decode_one(self, token_id: int, skip_special_tokens: bool = True) -> str:
        """``decode([token_id])``, remembered: a decode depends on its ids alone."""
        key = (token_id, skip_special_tokens)
        text = self._one.get(key)
        if text is None:
            text = self._one[key] = self.decode([token_id], skip_special_tokens)
        return text

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True,
                            **extra: object) -> str:
        """The prompt text for `messages`; raises ChatTemplateMissing when the model has none."""
        if isinstance(self._template, ChatTemplateError):
            raise self._template
        return render_chat_template(self._template, messages,
                                    add_generation_prompt=add_generation_prompt,
                                    special_tokens=self.meta.special_tokens, **extra)

    def incremental_detokenizer(self, skip_special_tokens: bool = True) -> IncrementalDetokenizer:
        return IncrementalDetokenizer(self, skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self.backend.token_to_id(token)

    # --- persistence (the converted-weight cache stores tokenizers this way) ---
    def save(self, directory: str | Path) -> None:
        directory = Path(directory)
        self.backend.save(str(directory / "tokenizer.json"))
        (directory / "tokenizer_meta.json").write_text(json.dumps(self.meta.to_dict(), indent=1))

    @classmethod
    def load(cls, directory: str | Path) -> Tokenizer:
        directory = Path(directory)
        backend = HFTokenizer.from_file(str(directory / "tokenizer.json"))
        meta = TokenizerMeta.from_dict(json.loads((directory / "tokenizer_meta.json").read_text()))
        return cls(backend, meta)


def byte_alphabet() -> dict[int, str]:
    """GPT-2's byte -> printable character map (what ByteLevel pre-tokenizer/decoder use)."""
    return dict(zip(*_gpt2_bytes_to_unicode(), strict=True))


def _gpt2_bytes_to_unicode() -> tuple[list[int], list[str]]:
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return bs, [chr(c) for c in cs]


SYNTHETIC_SPECIALS = ("<|bos|>", "<|eos|>", "<|im_start|>", "<|im_end|>", "<|pad|>")


def byte_level_tokenizer(vocab_size: int) -> Tokenizer:
    """A tokenizer for synthetic models: ids 0-255 are the bytes, then the special tokens, then
    filler words " w<id>" up to `vocab_size`.

    Text always encodes to bytes (there are no merges), so decode(encode(t)) == t. The fillers
    exist because a random model samples ids from its whole vocabulary: each one decodes to a
    short visible word, so streamed benchmarks get a content delta for every token.
    """
    alphabet = byte_alphabet()
    vocab = {alphabet[b]: b for b in range(256)}
    n_special = len(SYNTHETIC_SPECIALS)
    if vocab_size < 256 + n_special:
        raise ValueError(f"vocab_size must be at least {256 + n_special}, got {vocab_size}")
    # Special tokens sit right after the bytes, inside the model vocabulary, so their ids are
    # stable and the added-token ids never collide with the fillers.
    for i, token in enumerate(SYNTHETIC_SPECIALS):
        vocab[token] = 256 + i
    space = alphabet[ord(" ")]
    for i in range(256 + n_special, vocab_size):
        vocab[f"{space}w{i}"] = i
    backend = HFTokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                for t in SYNTHETIC_SPECIALS])
    ids = {t: backend.token_to_id(t) for t in SYNTHETIC_SPECIALS}
    meta = TokenizerMeta(
        eos_token_ids=(ids["<|eos|>"], ids["<|im_end|>"]), bos_token_id=ids["<|bos|>"],
        add_bos_token=False, chat_template=CHATML_TEMPLATE,
        special_tokens={"bos_token": "<|bos|>", "eos_token": "<|eos|>", "pad_token": "<|pad|>"})
    return Tokenizer(backend, meta)
