"""Tokenizers built from GGUF metadata: SentencePiece ("llama") and byte-level BPE ("gpt2")."""

from __future__ import annotations

import gguf
import pytest

from backend.weights.gguf_loader import read_metadata
from backend.weights.gguf_tokenizer import tokenizer_from_gguf
from tests.backend.weights.gguf_fixtures import write_sentencepiece_gguf

TEXTS = ["Hello world", "The quick brown fox jumps over the lazy dog.", "Paris, France!",
         "ünïcode 🎉 zz — not in the vocabulary", "a\nb\tc", "def add(a, b):\n    return a"]


@pytest.fixture(scope="module")
def sp_gguf(tmp_path_factory):
    return write_sentencepiece_gguf(tmp_path_factory.mktemp("sp") / "sp.gguf")


def test_sentencepiece_matches_transformers(sp_gguf):
    transformers = pytest.importorskip("transformers")
    ref = transformers.AutoTokenizer.from_pretrained(str(sp_gguf.parent), gguf_file=sp_gguf.name)
    ours = tokenizer_from_gguf(read_metadata(gguf.GGUFReader(str(sp_gguf))))
    for text in TEXTS:
        ids = ours.encode(text)
        assert ids == ref.encode(text, add_special_tokens=False), text
        assert ours.decode(ids) == ref.decode(ids, skip_special_tokens=True) == text
    assert len(ours.encode(TEXTS[1])) < 20  # merges really apply (44 characters)
    assert ours.bos_token_id == 1 and ours.eos_token_ids == (2,) and ours.add_bos_token
    # Unknown characters fall back to byte tokens <0x..>, and decode back.
    assert ours.token_to_id("<0xF0>") in ours.encode("🎉")


def test_sentencepiece_leading_spaces_roundtrip(sp_gguf):
    """SentencePiece always adds one dummy-prefix space (llama.cpp too), so leading spaces
    survive a round trip. transformers' GGUF conversion uses a Metaspace that drops one here;
    we follow SentencePiece."""
    ours = tokenizer_from_gguf(read_metadata(gguf.GGUFReader(str(sp_gguf))))
    for text in ("  two spaces", " one", "   three\n  indented"):
        assert ours.decode(ours.encode(text)) == text
    detok = ours.incremental_detokenizer()
    ids = ours.encode("Hello world, hello there")
    assert "".join(detok.push(i) for i in ids) + detok.flush() == "Hello world, hello there"


def test_unsupported_tokenizer_model():
    with pytest.raises(ValueError, match="unsupported GGUF tokenizer model 'bert'"):
        tokenizer_from_gguf({"tokenizer.ggml.model": "bert", "tokenizer.ggml.tokens": ["a"]})
