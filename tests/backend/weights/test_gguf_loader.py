"""GGUF loader: every claimed tensor type, name mapping, Q/K un-permute, config, cache."""

from __future__ import annotations

import os
import shutil
import time

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize, quantize

from backend.weights import cache, gguf_loader
from backend.weights.gguf_loader import load_gguf, unpermute_qk
from tests.backend.weights.gguf_fixtures import (
    K_QUANT_SCALES,
    K_SHAPE,
    SHAPE,
    llama_cpp_rope_factors,
    permute,
    random_hf_tensors,
    write_llama_gguf,
)

TYPES = [Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1]
# Worst error against the unquantised tensor (values ~N(0, 0.5)): a wrong un-permute or a
# wrong name gives errors of order 1, far above these.
TOLERANCE = {Q.F32: 0, Q.F16: 2e-3, Q.BF16: 2e-2, Q.Q8_0: 3e-2, Q.Q4_0: 0.5, Q.Q4_1: 0.4,
             Q.Q5_0: 0.25, Q.Q5_1: 0.2}


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("FIRSTTOKEN_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _roundtrip(array: np.ndarray, qtype: Q) -> np.ndarray:
    """What the file holds for `array`, dequantised by the gguf package."""
    if array.ndim == 1 or qtype == Q.F32:
        return array
    if qtype == Q.F16:
        return array.astype(np.float16).astype(np.float32)
    return dequantize(quantize(array, qtype), qtype)


@pytest.mark.parametrize("qtype", TYPES, ids=lambda q: q.name)
def test_each_type_dequantises_to_hf_layout(tmp_path, cache_dir, qtype):
    hf = random_hf_tensors(seed=1)
    path = write_llama_gguf(tmp_path / f"tiny-{qtype.name}.gguf", hf, qtype)
    source = load_gguf(path, use_cache=False)
    ours = dict(source.weights())
    assert set(ours) == set(hf)
    for name, original in hf.items():
        got = ours[name].float().numpy()
        assert got.shape == original.shape, name
        np.testing.assert_array_equal(got, _roundtrip(original, qtype), err_msg=name)
        assert np.abs(got - original).max() <= TOLERANCE[qtype], name


@pytest.mark.parametrize("qtype", TYPES, ids=lambda q: q.name)
def test_matches_transformers_gguf_loader(tmp_path, cache_dir, qtype):
    transformers = pytest.importorskip("transformers")
    hf = random_hf_tensors(seed=2)
    path = write_llama_gguf(tmp_path / f"tiny-{qtype.name}.gguf", hf, qtype)
    ref = transformers.AutoModelForCausalLM.from_pretrained(
        str(tmp_path), gguf_file=path.name, dtype=torch.float32).state_dict()
    ours = dict(load_gguf(path).weights())
    assert set(ours) == set(ref)
    for name, tensor in ours.items():
        torch.testing.assert_close(tensor.float(), ref[name], rtol=0, atol=0, msg=name)


@pytest.mark.parametrize("qtype", list(K_QUANT_SCALES), ids=lambda q: q.name)
def test_k_quants_match_transformers(tmp_path, cache_dir, qtype):
    """Q2_K..Q6_K (what Q4_K_M files are made of): the gguf package's dequantiser, our names
    and un-permute, against transformers' own (torch) dequantiser."""
    transformers = pytest.importorskip("transformers")
    hf = random_hf_tensors(seed=7, shape=K_SHAPE)
    path = write_llama_gguf(tmp_path / f"k-{qtype.name}.gguf", hf, qtype, shape=K_SHAPE)
    ref = transformers.AutoModelForCausalLM.from_pretrained(
        str(tmp_path), gguf_file=path.name, dtype=torch.float32).state_dict()
    ours = dict(load_gguf(path, use_cache=False).weights())
    assert set(ours) == set(ref)
    for name, tensor in ours.items():
        assert tensor.abs().max() > 0, name
        torch.testing.assert_close(tensor, ref[name], rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_biases_and_qwen2_arch_match_transformers(tmp_path, cache_dir, arch):
    """q/k/v biases (permuted like their weights under the llama arch) and the qwen2 arch,
    whose Q/K rows are stored unpermuted."""
    transformers = pytest.importorskip("transformers")
    hf = random_hf_tensors(seed=4, bias=True)
    path = write_llama_gguf(tmp_path / f"tiny-{arch}.gguf", hf, Q.Q8_0, arch=arch)
    source = load_gguf(path)
    assert source.config.attention_bias is True
    ours = dict(source.weights())
    for name, original in hf.items():
        np.testing.assert_array_equal(ours[name].numpy(), _roundtrip(original, Q.Q8_0), name)
    if arch == "qwen2":  # transformers' llama GGUF path ignores biases; compare qwen2 only
        ref = transformers.AutoModelForCausalLM.from_pretrained(
            str(tmp_path), gguf_file=path.name, dtype=torch.float32).state_dict()
        for name, tensor in ours.items():
            torch.testing.assert_close(tensor, ref[name], rtol=0, atol=0, msg=name)


def test_large_models_dequantise_to_float16(tmp_path, cache_dir, monkeypatch):
    monkeypatch.setattr(gguf_loader, "FLOAT32_MAX_PARAMS", 1000)  # "large" = this tiny model
    hf = random_hf_tensors(seed=5)
    source = load_gguf(write_llama_gguf(tmp_path / "big.gguf", hf, Q.Q4_1), use_cache=False)
    assert source.config.torch_dtype == "float16"
    ours = dict(source.weights())
    for name, original in hf.items():
        expected = _roundtrip(original, Q.Q4_1)
        if original.ndim == 2:
            assert ours[name].dtype == torch.float16, name
            expected = expected.astype(np.float16)
        np.testing.assert_array_equal(ours[name].numpy(), expected, err_msg=name)


def test_config_and_tokenizer_from_metadata(tmp_path, cache_dir):
    path = write_llama_gguf(tmp_path / "tiny.gguf", random_hf_tensors(tied=True), Q.F32)
    source = load_gguf(path)
    c = source.config
    assert (c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim) == \
        (SHAPE["hidden"], SHAPE["heads"], SHAPE["kv_heads"], SHAPE["hidden"] // SHAPE["heads"])
    assert (c.intermediate_size, c.num_hidden_layers, c.max_position_embeddings) == \
        (SHAPE["inter"], SHAPE["layers"], SHAPE["ctx"])
    assert c.rope_theta == 50000.0 and c.rms_norm_eps == pytest.approx(1e-5)
    assert c.tie_word_embeddings is True and c.vocab_size == 288
    assert "lm_head.weight" not in dict(source.weights())
    tok = source.tokenizer
    assert tok.eos_token_ids == (2,) and tok.bos_token_id == 0
    assert tok.encode("<|im_start|>hi") == [1, 3 + ord("h"), 3 + ord("i")]
    assert tok.apply_chat_template([{"role": "user", "content": "x"}]) == \
        "<|im_start|>user\nx<|im_end|>\n<|im_start|>assistant\n"


@pytest.mark.parametrize("factor,original", [(8.0, None), (32.0, 256)])
def test_llama3_rope_scaling_recovered_from_rope_freqs(tmp_path, cache_dir, factor, original):
    hd = SHAPE["hidden"] // SHAPE["heads"]
    factors = llama_cpp_rope_factors(50000.0, hd, factor, 1.0, 4.0, original or 8192)
    assert np.any((factors > 1) & (factors < factor))  # the smoothed band is exercised too
    path = write_llama_gguf(tmp_path / "l3.gguf", random_hf_tensors(), Q.F32,
                            rope_freqs=factors, original_ctx=original)
    source = load_gguf(path)
    assert source.config.rope_scaling == {
        "rope_type": "llama3", "factor": factor, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": original or 8192}
    assert "rope_freqs.weight" not in dict(source.weights())


def test_unknown_rope_freqs_fall_back_with_warning(tmp_path, cache_dir, caplog):
    hd = SHAPE["hidden"] // SHAPE["heads"]
    path = write_llama_gguf(tmp_path / "odd.gguf", random_hf_tensors(), Q.F32,
                            rope_freqs=np.linspace(1, 3, hd // 2))
    assert load_gguf(path).config.rope_scaling is None
    assert "rope_freqs" in caplog.text


def test_unpermute_inverts_llama_cpp_permute():
    w = np.arange(8 * 16 * 3, dtype=np.float32).reshape(8 * 16, 3)
    for heads in (1, 2, 8):
        np.testing.assert_array_equal(unpermute_qk(permute(w, heads), heads), w)
    assert not np.array_equal(permute(w, 8), w)


def test_cache_hit_skips_conversion_and_detects_changes(tmp_path, cache_dir, monkeypatch):
    path = write_llama_gguf(tmp_path / "tiny.gguf", random_hf_tensors(seed=3), Q.Q8_0)
    first = dict(load_gguf(path).weights())
    assert cache.lookup(path) is not None

    def no_convert(_path):
        raise AssertionError("converted again despite a cache entry")

    monkeypatch.setattr(gguf_loader, "convert_gguf", no_convert)
    second = load_gguf(path)
    for name, tensor in second.weights():
        assert torch.equal(tensor, first[name]), name
    # The same bytes with a new mtime, or copied elsewhere (a fresh clone extracts the model
    # again): the one entry serves them all, so the cache does not grow by a copy per clone.
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    copy = tmp_path / "elsewhere" / path.name
    copy.parent.mkdir()
    shutil.copyfile(path, copy)
    assert cache.lookup(path) == cache.lookup(copy) is not None
    load_gguf(copy)
    assert len(list((cache_dir / "converted").iterdir())) == 1
    # Changed bytes past the header (an edit, so a new mtime): never the old entry.
    with open(copy, "r+b") as fh:
        fh.seek(-1, os.SEEK_END)
        last = fh.read(1)
        fh.seek(-1, os.SEEK_END)
        fh.write(bytes([last[0] ^ 0xFF]))
    st = os.stat(copy)
    os.utime(copy, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert cache.lookup(copy) is None
    with pytest.raises(AssertionError, match="converted again"):
        load_gguf(copy)


def test_cache_shards_and_unwritable_cache(tmp_path, cache_dir, monkeypatch):
    hf = random_hf_tensors(seed=6)
    path = write_llama_gguf(tmp_path / "tiny.gguf", hf, Q.Q4_0)
    monkeypatch.setattr(cache, "SHARD_BYTES", 64 * 1024)
    source = load_gguf(path)
    entry = cache.lookup(path)
    assert len(cache.entry_files(entry)) > 2
    expected = {k: _roundtrip(v, Q.Q4_0) for k, v in hf.items()}
    got = dict(source.weights())
    assert set(got) == set(expected)
    for name, tensor in got.items():
        np.testing.assert_array_equal(tensor.numpy(), expected[name], err_msg=name)
    # A cache that cannot be written: still loads (streaming the conversion), and again.
    blocker = tmp_path / "blocked"
    blocker.write_text("a file where the cache directory should be")
    monkeypatch.setenv("FIRSTTOKEN_CACHE", str(blocker))
    source = load_gguf(path)
    for _ in range(2):
        again = dict(source.weights())
        for name, tensor in again.items():
            np.testing.assert_array_equal(tensor.numpy(), expected[name], err_msg=name)


def test_not_a_gguf_is_a_clear_error(tmp_path, cache_dir):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf at all" * 10)
    with pytest.raises(ValueError, match="not a readable GGUF"):
        load_gguf(bad)


def test_embedded_smollm2_matches_transformers(cache_dir):
    """The real embedded model (Q8_0 embeddings, Q4_1 weights): exact tensors, config, and a
    second start that is served from the cache."""
    transformers = pytest.importorskip("transformers")
    from backend.weights import embedded, load_model_source

    path = embedded.find_or_fetch()
    source = load_model_source(embedded.EMBEDDED_NAME)
    assert source.name == "smollm2-135m-instruct"
    ref_model = transformers.AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32)
    ref = ref_model.state_dict()
    ours = dict(source.weights())
    assert set(ref) - set(ours) == {"lm_head.weight"}  # tied: the model reuses embed_tokens
    assert set(ours) <= set(ref)
    for name, tensor in ours.items():
        assert torch.equal(tensor, ref[name]), name
    rc = ref_model.config
    c = source.config
    assert c.tie_word_embeddings and rc.tie_word_embeddings
    for field in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                  "num_attention_heads", "num_key_value_heads", "head_dim",
                  "max_position_embeddings", "rms_norm_eps"):
        assert getattr(c, field) == getattr(rc, field), field
    assert c.rope_theta == rc.rope_parameters["rope_theta"]
    started = time.perf_counter()
    again = load_model_source(embedded.EMBEDDED_NAME)
    assert cache.lookup(path) is not None
    assert again.config == c
    # Not a timing assertion: just recorded so a slow cache shows up in the test log.
    print(f"cached load took {time.perf_counter() - started:.2f}s")


def test_concurrent_first_starts_share_one_cache_entry(tmp_path, cache_dir):
    """Two processes converting the same file at once (make run + a test, two replicas): both
    load, and the cache ends with one complete entry and no temporary directories."""
    import subprocess
    import sys

    path = write_llama_gguf(tmp_path / "race.gguf", random_hf_tensors(seed=8), Q.Q8_0)
    code = ("import sys; from backend.weights.gguf_loader import load_gguf; "
            "s = load_gguf(sys.argv[1]); print(sum(t.numel() for _, t in s.weights()))")
    env = dict(os.environ, FIRSTTOKEN_CACHE=str(cache_dir))
    procs = [subprocess.Popen([sys.executable, "-c", code, str(path)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err[-2000:] for _, err in outs]
    assert outs[0][0] == outs[1][0] and int(outs[0][0]) > 0
    entries = list((cache_dir / "converted").iterdir())
    assert entries == [cache.entry_dir(path)] and cache.lookup(path) is not None


def test_undequantisable_type_fails_at_load(tmp_path, cache_dir, monkeypatch):
    path = write_llama_gguf(tmp_path / "q.gguf", random_hf_tensors(seed=9), Q.Q4_0)

    def refuse(data, qtype):
        raise NotImplementedError(f"no {qtype.name}")

    monkeypatch.setattr(gguf_loader, "dequantize", refuse)
    with pytest.raises(ValueError, match="type Q4_0 cannot be dequantised"):
        load_gguf(path)
