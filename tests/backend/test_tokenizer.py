"""Tokenizer: the embedded model's tokenizer against transformers', streaming detokenizing,
the synthetic byte-level tokenizer."""

from __future__ import annotations

import functools
import random

import pytest

from backend.tokenizer import byte_level_tokenizer
from backend.weights import embedded

TEXTS = [
    "Hello, world!",
    "What is the capital of France?",
    "  leading spaces, trailing spaces   ",
    "tabs\tand\nnewlines\n\n\nand\r\nCRLF",
    "Numbers: 3.14159, 2024-11-30, 1,000,000 and 007",
    "Unicode: naïve café, Ελληνικά, русский, 中文字符, 日本語のテキスト, 한국어, العربية",
    "Emoji: 🎉🚀 👩‍👩‍👧‍👦 🏳️‍🌈 ❤️",
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)  # 🐍\n",
    "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
    "It's, they're, we've, I'm, you'll, he'd — don't!",
    "",
    " ",
    "\u00a0non-breaking\u2009thin\u200bzero-width",
]


@functools.lru_cache(maxsize=1)
def _smollm2():
    from backend.weights import load_model_source

    return load_model_source(embedded.EMBEDDED_NAME).tokenizer


@functools.lru_cache(maxsize=1)
def _reference():
    transformers = pytest.importorskip("transformers")
    path = embedded.find_or_fetch()
    return transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


@pytest.mark.parametrize("text", TEXTS)
def test_encode_decode_match_transformers(text):
    ours, ref = _smollm2(), _reference()
    ids = ours.encode(text)
    assert ids == ref.encode(text, add_special_tokens=False)
    assert ours.decode(ids) == ref.decode(ids, skip_special_tokens=True)
    assert ours.decode(ids, skip_special_tokens=False) == ref.decode(ids)
    assert ours.decode(ids, skip_special_tokens=False) == text


def test_smollm2_ids_and_specials():
    tok = _smollm2()
    assert tok.vocab_size == 49152
    assert tok.eos_token_ids == (2,) and tok.bos_token_id == 1
    assert tok.token_to_id("<|im_end|>") == 2
    assert tok.encode("<|im_end|>") == [2]


def _stream(tok, ids):
    detok = tok.incremental_detokenizer()
    deltas = [detok.push(i) for i in ids]
    return deltas, "".join(deltas) + detok.flush()


@pytest.mark.parametrize("text", [t for t in TEXTS if t])
def test_incremental_detokenizer_equals_full_decode(text):
    tok = _smollm2()
    ids = tok.encode(text)
    deltas, joined = _stream(tok, ids)
    assert joined == tok.decode(ids)
    assert all("\ufffd" not in d for d in deltas)  # never a broken character mid-stream


def test_incremental_detokenizer_holds_back_split_characters():
    tok = byte_level_tokenizer(512)
    ids = tok.encode("a🎉b")  # the emoji is 4 byte tokens
    assert len(ids) == 6
    deltas, joined = _stream(tok, ids)
    assert deltas == ["a", "", "", "", "🎉", "b"] and joined == "a🎉b"


def test_incremental_detokenizer_gives_up_on_invalid_bytes():
    tok = byte_level_tokenizer(512)
    bad = [0xF0, 0x9F, 0xFF, 0xFE, 0xFD]  # never valid UTF-8: must not stall the stream
    deltas, joined = _stream(tok, [ord("x")] + bad + [ord("y")])
    assert deltas[0] == "x" and "".join(deltas).endswith("y")
    assert "\ufffd" in joined


def test_incremental_detokenizer_random_ids_are_consistent():
    tok = _smollm2()
    rng = random.Random(0)
    ids = [rng.randrange(tok.vocab_size) for _ in range(300)]
    _, joined = _stream(tok, ids)
    assert joined == tok.decode(ids)


def test_incremental_detokenizer_skips_special_tokens():
    tok = _smollm2()
    ids = tok.encode("Paris<|im_end|>")
    _, joined = _stream(tok, ids)
    assert joined == "Paris"


def test_byte_level_tokenizer_roundtrip_and_fillers():
    tok = byte_level_tokenizer(32000)
    assert tok.vocab_size == 32000
    for text in TEXTS:
        assert tok.decode(tok.encode(text), skip_special_tokens=False) == text
    assert tok.encode("é") == [0xC3, 0xA9]
    # Ids a random model samples beyond the bytes decode to visible words.
    assert tok.decode([1000, 31999]) == " w1000 w31999"
    bos, eos = tok.token_to_id("<|bos|>"), tok.token_to_id("<|eos|>")
    assert tok.bos_token_id == bos and eos in tok.eos_token_ids
    assert tok.token_to_id("<|im_end|>") in tok.eos_token_ids
    assert tok.encode("<|im_start|>") == [tok.token_to_id("<|im_start|>")]
    with pytest.raises(ValueError, match="at least"):
        byte_level_tokenizer(100)
