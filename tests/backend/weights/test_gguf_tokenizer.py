"""Tokenizers built from GGUF metadata: SentencePiece ("llama") and byte-level BPE ("gpt2")."""

from __future__ import annotations

import gguf
import pytest

from backend.weights.gguf_loader import read_metadata
from backend.weights.gguf_tokenizer import tokenizer_from_gguf
from tests.backend.weights.gguf_fixtures import write_bpe_gguf, write_sentencepiece_gguf

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


BPE_TEXTS = TEXTS + ["Numbers 1234567890 and 2024, 31415!", "  spaced\n\n  out  ", "it's they're"]


def _load(path):
    return tokenizer_from_gguf(read_metadata(gguf.GGUFReader(str(path))))


@pytest.mark.parametrize("pre", ["default", "llama-bpe", "qwen2", "tekken"])
def test_byte_level_pre_tokenizers_match_transformers(tmp_path, pre):
    transformers = pytest.importorskip("transformers")
    path = write_bpe_gguf(tmp_path / f"{pre}.gguf", pre)
    ref = transformers.AutoTokenizer.from_pretrained(str(tmp_path), gguf_file=path.name)
    ours = _load(path)
    for text in BPE_TEXTS:
        ids = ours.encode(text)
        assert ids == ref.encode(text, add_special_tokens=False), (pre, text)
        assert ours.decode(ids) == text
    assert ours.encode("x<|im_end|>")[-1] == 1 and ours.eos_token_ids == (1,)


def test_smollm_pre_tokenizer_splits_digits(tmp_path):
    """SmolLM2's own tokenizer (and llama.cpp's "smollm") puts every digit in its own
    pre-token; transformers' GGUF conversion does not, so compare with the rule itself."""
    ours = _load(write_bpe_gguf(tmp_path / "smollm.gguf", "smollm"))
    default = _load(write_bpe_gguf(tmp_path / "default.gguf", "default"))
    text = "Numbers 1234567890 and 2024"
    assert len(default.encode(text)) < len(ours.encode(text))
    digits = ours.encode("1234567890")
    assert [ours.decode([i]) for i in digits] == list("1234567890")


def test_split_regexes_agree_with_transformers():
    pytest.importorskip("transformers")
    from transformers.integrations.gguf.gguf_tokenizer_mapping import GGUF_PRE_TOKENIZER_SPLITS

    from backend.weights.gguf_tokenizer import _PRE_SPLITS

    shared = set(_PRE_SPLITS) & set(GGUF_PRE_TOKENIZER_SPLITS)
    assert {"llama-bpe", "qwen2", "tekken"} <= shared
    for pre in shared:
        assert _PRE_SPLITS[pre] == (GGUF_PRE_TOKENIZER_SPLITS[pre],), pre
