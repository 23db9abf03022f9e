"""The engine and its CPU code compiled ahead of time (the int8 LM head's one-row GEMV, the
int4 x int8 op, the layer pieces for one-row steps and for steps of 2-8 rows): built by
``python -m backend.engine.build_kernels`` into the weights cache, loaded by later engines
(``--cpu-aot-kernels auto``) with the eager path's greedy tokens, and refused, with the
reason in the stats, where they are missing, off, unreadable or wrong."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from backend.engine import aot_kernels, aot_layers, model_runner
from backend.engine.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.engine.sampling import SamplingParams
from backend.layers import cpu_aot, cpu_dequant, cpu_paged_decode, cpu_w4a8, linear
from backend.layers.linear import ONE_ROW_AOT_KERNEL, Linear, frozen
from backend.weights.loader import load_model_source
from tests.backend.layers.test_cpu_aot import Counting
from tests.backend.layers.test_cpu_paged_decode import CountingSteps

MODEL = "synthetic:tiny"
# torch's int4 kernel (not the default int4 x int8 op): these tests check the packages
# against the eager path's tokens; the op's own test below takes the default
FLAGS = dict(weights_dtype="int4", lm_head_dtype="int8", dtype="float32",
             cpu_int4_activations="model")
DEFAULT_FLAGS = {k: v for k, v in FLAGS.items() if k != "cpu_int4_activations"}
PROMPTS = [[5, 9, 13, 2, 7], [40, 41, 42]]


# The int8 head's one-row GEMV package is what these tests follow: on CPUs without AVX-512
# the engine gives the head ``cpu_int8_rows`` instead (``test_cpu_int8_rows.py``), so the
# choice is pinned here, in the engines and in the build command's process
PIN_GEMV = ("from backend.engine import model_runner; "
            "model_runner.int8_head_rows_kernel = lambda: False")


@pytest.fixture(autouse=True)
def _gemv_head(monkeypatch):
    monkeypatch.setattr(model_runner, "int8_head_rows_kernel", lambda: False)


def engine(mode: str) -> LLMEngine:
    return LLMEngine(EngineConfig(cpu_aot_kernels=mode, kv_cache_memory_gib=0.01,
                                  max_model_len=128, **FLAGS), load_model_source(MODEL))


def build_command(cache, flags: dict[str, str] = FLAGS, **env: str
                  ) -> subprocess.CompletedProcess:
    """``python -m backend.engine.build_kernels`` for MODEL with ``flags`` into ``cache``."""
    flags = [a for k, v in flags.items() for a in (f"--{k.replace('_', '-')}", v)]
    main = "import sys; from backend.engine.build_kernels import main; sys.exit(main())"
    return subprocess.run(
        [sys.executable, "-c", f"{PIN_GEMV}; {main}", "--model", MODEL, *flags],
        capture_output=True, text=True, timeout=300,
        env=dict(os.environ, FIRSTTOKEN_CACHE=str(cache), **env))


def greedy(eng: LLMEngine) -> list[list[int]]:
    # one prompt at a time: every decode step's head call is one row
    return [eng.generate([p], SamplingParams(max_tokens=12, ignore_eos=True, temperature=0))[0]
            for p in PROMPTS]


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """A weights cache where the command line built the tiny model's head GEMV (an engine
    started before the build found none)."""
    root = tmp_path_factory.mktemp("cache")
    mp = pytest.MonkeyPatch()
    mp.setenv("FIRSTTOKEN_CACHE", str(root))
    mp.setattr(model_runner, "int8_head_rows_kernel", lambda: False)
    try:
        before = engine("auto")
        s = before.stats()
        assert s.cpu_aot_kernels["lm_head"] == "not built"
        assert "python -m backend.engine.build_kernels" in s.cpu_aot_kernels["reason"]
        assert s.lm_head_kernel == "torch._weight_int8pack_mm"
        del before
        proc = build_command(root)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert proc.stdout.startswith("LM head: built: "), proc.stdout
        assert "\nint4 x int8 op: off (" in proc.stdout, proc.stdout  # not asked for
        assert "\none-token layers: built: " in proc.stdout, proc.stdout
        assert "\n2-8-row layers: built: " in proc.stdout, proc.stdout
        decode = "built: " if cpu_paged_decode.why_not_here() is None else "not used ("
        assert f"\npaged decode attention: {decode}" in proc.stdout, proc.stdout
        yield root
    finally:
        mp.undo()


def test_built_once_then_loaded_with_torchs_greedy_tokens(cache, monkeypatch):
    root = cache
    monkeypatch.setenv("FIRSTTOKEN_CACHE", str(root))
    eng = engine("auto")
    head = eng.runner.model.lm_head
    packages = sorted((root / "kernels").glob("*.pt2"))
    gemv = root / "kernels" / cpu_aot.package_name(*head.weight_shape, torch.float32)
    (one_row, pieces), (rows, few) = aot_layers.package_paths(eng.runner.model,
                                                              root / "kernels")
    assert (one_row, rows) == ((1, 1), (2, 8))
    assert packages == sorted([gemv, pieces, few])
    s = eng.stats()
    assert s.cpu_aot_kernels == {
        "mode": "auto", "lm_head": "loaded", "reason": "", "path": str(gemv),
        "build_seconds": None, "layers": {"status": "loaded", "reason": "",
                                          "path": str(pieces), "build_seconds": None},
        "few_rows_layers": {"status": "loaded", "reason": "", "path": str(few),
                            "build_seconds": None, "rows": [2, 8]},
        "decode_attention": s.cpu_aot_kernels["decode_attention"],
        "int4_w4a8": s.cpu_aot_kernels["int4_w4a8"]}
    assert s.lm_head_kernel == ONE_ROW_AOT_KERNEL
    kernel, head.one_row = head.one_row, None
    tokens = greedy(eng)  # torch's kernel, same weights
    head.one_row = spy = Counting(kernel)
    assert greedy(eng) == tokens
    assert spy.calls == 2 * 12  # every step's head, prefill's last row included
    # the layer pieces: once per decode step (one pair of layers in the tiny model), with
    # the eager layers' greedy tokens (float32: the fused norms round as the eager ones)
    model = eng.runner.model
    pieces_fn, model.one_token_layers = model.one_token_layers, None
    eager_tokens = greedy(eng)
    calls = []
    model.one_token_layers = lambda *a: calls.append(a[0]) or pieces_fn(*a)
    assert greedy(eng) == eager_tokens
    assert calls == [0] * (2 * 11)  # 11 decode steps a prompt; the prefill runs eager
    # steps of 2-8 rows: both prompts at once (decodes at batch 2, the 3- and 5-token
    # prefills) through the other package, with the eager layers' tokens
    few_fn, model.few_rows_layers = model.few_rows_layers, None
    params = SamplingParams(max_tokens=12, ignore_eos=True, temperature=0)
    eager_pair = eng.generate(PROMPTS, params)
    model.few_rows_layers = spy_few = Counting(few_fn)
    spy_few.max_rows = few_fn.max_rows
    assert eng.generate(PROMPTS, params) == eager_pair
    assert spy_few.calls == 1 + 11  # the 8-token prefill step, 11 decode steps at batch 2
    # the build command again: nothing to compile
    proc = build_command(root)
    assert proc.returncode == 0 and proc.stdout.startswith("LM head: loaded: "), proc.stdout
    assert "\none-token layers: loaded: " in proc.stdout, proc.stdout
    assert "\n2-8-row layers: loaded: " in proc.stdout, proc.stdout


def test_decode_rows_read_the_cache_in_place_with_the_torch_paths_tokens(cache, monkeypatch):
    """The paged decode attention built beside the packages: loaded at start, called once
    per layer of every step with decode rows, with the torch path's greedy tokens."""
    monkeypatch.setenv("FIRSTTOKEN_CACHE", str(cache))
    eng = engine("auto")
    status = eng.stats().cpu_aot_kernels["decode_attention"]
    attn = eng.runner.attn
    if cpu_paged_decode.why_not_here() is not None:
        assert status["status"] == "not used" and attn.cpu_decode is None
        return
    assert status == {"status": "loaded", "reason": "", "build_seconds": None,
                      "path": str(cache / "kernels" / cpu_paged_decode.library_name())}
    # /health's attention_kernel names what runs: SDPA for prefill, the kernel for decodes
    assert eng.stats().attention_kernel == f"cpu_flash+{cpu_paged_decode.KERNEL_NAME}"
    kernel, attn.cpu_decode = attn.cpu_decode, None
    params = SamplingParams(max_tokens=12, ignore_eos=True, temperature=0)
    torch_path = eng.generate(PROMPTS, params)
    attn.cpu_decode = spy = CountingSteps(kernel)
    assert eng.generate(PROMPTS, params) == torch_path
    # every step (the prompts' and 11 decode steps at batch 2) stores through it: one call
    # a layer of each (two layers)
    assert spy.steps >= 12 and spy.calls == 2 * spy.steps
    off = engine("off")
    assert off.stats().cpu_aot_kernels["decode_attention"]["status"] == "off"
    assert off.runner.attn.cpu_decode is None
    assert off.stats().attention_kernel == "cpu_flash"
    # an int8 cache (the torch path's layout on the CPU): read in place too
    int8 = LLMEngine(EngineConfig(cpu_aot_kernels="auto", kv_cache_memory_gib=0.01,
                                  max_model_len=128, kv_cache_dtype="int8", **FLAGS),
                     load_model_source(MODEL))
    assert int8.stats().cpu_aot_kernels["decode_attention"]["status"] == "loaded"
    attn = int8.runner.attn
    kernel, attn.cpu_decode = attn.cpu_decode, None
    torch_path = int8.generate(PROMPTS, params)
    attn.cpu_decode = spy = CountingSteps(kernel)
    assert int8.generate(PROMPTS, params) == torch_path and spy.calls == 2 * spy.steps >= 24


def test_off_and_heads_without_one_run_torchs_kernels(cache, monkeypatch):
    monkeypatch.setenv("FIRSTTOKEN_CACHE", str(cache))
    off = engine("off")
    assert off.stats().cpu_aot_kernels["lm_head"] == "off"
    assert off.stats().lm_head_kernel == "torch._weight_int8pack_mm"
    assert off.runner.model.lm_head.one_row is None
    # a head under torch.compile (``--compile``) cannot call into the package
    loaded = engine("auto")
    model = loaded.runner.model
    assert model.lm_head.one_row is not None
    model.compiled_pieces = ["LlamaModel.head"]
    result = aot_kernels.attach(model, loaded.runner.attn, "auto",
                                FLAGS["cpu_int4_activations"])
    assert (result.lm_head, model.lm_head.one_row) == ("not used", None)
    assert "--compile" in result.reason
    dense = LLMEngine(EngineConfig(cpu_aot_kernels="build", kv_cache_memory_gib=0.01,
                                   max_model_len=128, dtype="float32"),
                      load_model_source(MODEL))
    s = dense.stats()
    assert (s.cpu_aot_kernels["lm_head"], s.lm_head_format) == ("not used", "fp32")
    assert "int8 LM head" in s.cpu_aot_kernels["reason"]
    assert s.cpu_aot_kernels["layers"]["status"] == "not used"  # dense layers run eager
    assert s.cpu_aot_kernels["few_rows_layers"]["status"] == "not used"
    assert dense.runner.model.one_token_layers is None
    assert dense.runner.model.few_rows_layers is None
    assert off.stats().cpu_aot_kernels["layers"]["status"] == "off"
    assert off.stats().cpu_aot_kernels["few_rows_layers"]["status"] == "off"
    assert off.runner.model.one_token_layers is None
    assert off.runner.model.few_rows_layers is None


def test_a_package_that_does_not_load_or_disagrees_is_not_used(cache, tmp_path, monkeypatch):
    root = cache
    (tmp_path / "kernels").mkdir()
    for built in (root / "kernels").glob("*.pt2"):  # the head's and the two layers'
        (tmp_path / "kernels" / built.name).write_bytes(b"not a package")
    for built in (root / "kernels").glob("int4-w4a8-*.so"):  # the op the layers call
        (tmp_path / "kernels" / built.name).write_bytes(built.read_bytes())
    monkeypatch.setenv("FIRSTTOKEN_CACHE", str(tmp_path))
    broken = engine("auto")
    s = broken.stats()
    assert s.cpu_aot_kernels["lm_head"] == "failed" and s.cpu_aot_kernels["reason"]
    assert s.cpu_aot_kernels["layers"]["status"] == "failed"
    assert s.cpu_aot_kernels["few_rows_layers"]["status"] == "failed"
    assert broken.runner.model.one_token_layers is None
    assert broken.runner.model.few_rows_layers is None
    assert s.lm_head_kernel == "torch._weight_int8pack_mm"
    assert broken.runner.model.lm_head.one_row is None
    assert all(len(t) == 12 for t in greedy(broken))  # serves on torch's kernel

    monkeypatch.setenv("FIRSTTOKEN_CACHE", str(root))
    monkeypatch.setattr(cpu_aot.OneRowInt8, "__call__",
                        lambda self, x, q, scale: torch.zeros(1, q.shape[0], dtype=x.dtype))
    wrong = engine("auto")
    s = wrong.stats()
    assert s.cpu_aot_kernels["lm_head"] == "failed"
    assert "disagrees with torch's int8 kernel" in s.cpu_aot_kernels["reason"]
    assert wrong.runner.model.lm_head.one_row is None
    assert s.cpu_aot_kernels["layers"]["status"] == "loaded"  # the other packages stand
    assert s.cpu_aot_kernels["few_rows_layers"]["status"] == "loaded"

    real_run = aot_layers.LayerPieces.__call__
    monkeypatch.setattr(aot_layers.LayerPieces, "__call__",
                        lambda self, *a: [t * 1.1 for t in real_run(self, *a)])
    off_by_ten = engine("auto")
    for key in ("layers", "few_rows_layers"):
        layers = off_by_ten.stats().cpu_aot_kernels[key]
        assert layers["status"] == "failed", key
        assert "disagrees with the eager layers" in layers["reason"], key
    assert off_by_ten.runner.model.one_token_layers is None
    assert off_by_ten.runner.model.few_rows_layers is None
    assert all(len(t) == 12 for t in greedy(off_by_ten))


def test_kernels_live_in_the_weights_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("FIRSTTOKEN_CACHE", str(tmp_path))
    assert aot_kernels.kernels_dir() == tmp_path / "kernels"


def test_without_a_cxx_compiler_the_build_fails_plainly(tmp_path):
    proc = build_command(tmp_path, CXX=str(tmp_path / "no-g++"))
    assert proc.returncode == 1, proc.stdout + proc.stderr[-2000:]
    assert proc.stdout.startswith("LM head: failed (") and "C++ compiler" in proc.stdout
    assert "\none-token layers: failed (" in proc.stdout
    assert "\n2-8-row layers: failed (" in proc.stdout
    assert not list((tmp_path / "kernels").glob("*.pt2"))


def test_the_layer_pieces_follow_the_layers_tensors(cache, monkeypatch):
    """Weights replaced after load (``Linear.generation`` moves): the pieces read the new
    tensors, not the ones they were bound to."""
    monkeypatch.setenv("FIRSTTOKEN_CACHE", str(cache))
    eng = engine("auto")
    model = eng.runner.model
    pieces = model.one_token_layers
    args = (torch.randn(1, model.cfg.num_attention_heads * model.cfg.head_dim),
            torch.randn(1, model.cfg.hidden_size), model.cos_table[3:4], model.sin_table[3:4])
    before = pieces(0, *args)
    layer = model.layers[0]
    layer.post_norm = frozen(layer.post_norm.detach() * 2)  # a new tensor in the layer
    Linear.generation += 1
    after = pieces(0, *args)
    with torch.inference_mode():
        want = aot_layers._Between(model.layers[0], model.layers[1])(*args)
    assert not torch.equal(before[3], after[3])
    torch.testing.assert_close(after[3], want[3], rtol=1e-4, atol=1e-4)


def test_an_engine_keeping_dense_copies_builds_the_pieces_at_start(tmp_path, monkeypatch):
    """``--cpu-aot-kernels build`` in an engine whose layers keep dense copies for many-row
    calls (the default; bf16 copies in oneDNN's layout, which export cannot take as
    constants): the copies are no input of the pieces and do not stop the export."""
    monkeypatch.setenv("FIRSTTOKEN_CACHE", str(tmp_path))
    eng = LLMEngine(EngineConfig(cpu_aot_kernels="build", kv_cache_memory_gib=0.01,
                                 max_model_len=128, **dict(FLAGS, dtype="bfloat16")),
                    load_model_source(MODEL))
    s = eng.stats()
    if s.prefill_kernel != "dense-copy+onednn":
        pytest.skip(f"no oneDNN bf16 copies on this CPU ({s.prefill_kernel})")
    assert s.prefill_dense_weights["enabled"]
    assert s.cpu_aot_kernels["layers"]["status"] == "built", s.cpu_aot_kernels["layers"]
    assert s.cpu_aot_kernels["few_rows_layers"]["status"] == "built"
    assert all(layer.qkv.prefill_weight is not None for layer in eng.runner.model.layers)
    assert all(len(t) == 12 for t in greedy(eng))


def test_int4_layers_run_the_int4_x_int8_op(cache, monkeypatch):
    """The default: built beside the packages and loaded first (the pieces call it), every
    int4 layer of whole tiles runs its few-row calls through it, in two int8 parts, with
    torch's kernel's greedy tokens; the build command builds it unasked; one part,
    ``model`` and ``--cpu-aot-kernels off`` as asked."""
    monkeypatch.setenv("FIRSTTOKEN_CACHE", str(cache))
    assert EngineConfig().cpu_int4_activations == "int8x2"
    assert engine("auto").stats().cpu_aot_kernels["int4_w4a8"]["status"] == "off"  # model
    built, build = [], linear._QuantizedLinear._build_copy
    monkeypatch.setattr(linear._QuantizedLinear, "_build_copy",
                        lambda self: built.append(self) or build(self))
    eng = LLMEngine(EngineConfig(cpu_aot_kernels="build", kv_cache_memory_gib=0.01,
                                 max_model_len=128, **DEFAULT_FLAGS),
                    load_model_source(MODEL))
    status = eng.stats().cpu_aot_kernels["int4_w4a8"]
    layers = [m for layer in eng.runner.model.layers
              for m in (layer.qkv, layer.o, layer.gate_up, layer.down)]
    if cpu_w4a8.why_not_here() is not None:
        assert status["status"] == "not used" and not any(m.w4a8 for m in layers)
        return
    assert status["status"] in ("built", "loaded")  # the fixture's command built no op
    assert {k: status[k] for k in ("reason", "path", "layers", "activations")} == {
        "reason": "", "path": str(cache / "kernels" / cpu_w4a8.library_name()),
        "layers": len(layers), "activations": "int8x2"}
    assert all(m.w4a8 and m.kernel == "cpu-int4-w4a8x2" for m in layers)
    # the dense copies built once each, after the op was attached (from its codes)
    copies = [m for m in layers if m.prefill_weight is not None]
    assert eng.stats().prefill_dense_weights["enabled"] == bool(copies)
    head = eng.runner.model.lm_head
    assert sorted(map(id, built)) == sorted(map(id, copies + [head] * (
        head.prefill_weight is not None)))
    # one packed copy of the codes: torch's packing went once the op was attached
    assert not any(m.torch_packed or "packed" in m._buffers for m in layers)
    assert status["torch_packing_freed_bytes"] == sum(  # codes [N, K/2], scale|zero pairs
        m.out_features * (m.in_features // 2 + m.in_features // m.group_size * 2
                          * m.dtype.itemsize) for m in layers)
    assert eng.runner.model.few_rows_layers is not None  # the pieces call it
    # ... up to the op's own switch to the dense copies, later than torch's kernel's
    rows = eng.stats().cpu_aot_kernels["few_rows_layers"]["rows"]
    assert rows == [2, cpu_dequant.few_rows_limit("int4-w4a8") - 1] == [2, 31]
    model = eng.runner.model  # a decode step of 12 rows (torch's kernel: eager) runs them
    model.few_rows_layers = spy = Counting(model.few_rows_layers)
    eng.generate([[5 + i, 9, 13] for i in range(12)],
                 SamplingParams(max_tokens=3, ignore_eos=True, temperature=0))
    assert spy.calls == 2  # the two decode steps; the 36-token prefill runs eager
    model.few_rows_layers = spy.kernel
    proc = build_command(cache, DEFAULT_FLAGS)  # make model's command: the op is built
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "\nint4 x int8 op: loaded: " in proc.stdout, proc.stdout
    params = SamplingParams(max_tokens=12, ignore_eos=True, temperature=0)
    with_op = eng.generate(PROMPTS, params)
    plain = LLMEngine(EngineConfig(cpu_aot_kernels="auto", kv_cache_memory_gib=0.01,
                                   max_model_len=128, **FLAGS),
                      load_model_source(MODEL))
    assert plain.stats().cpu_aot_kernels["int4_w4a8"]["status"] == "off"
    assert not any(layer.qkv.w4a8 for layer in plain.runner.model.layers)
    assert plain.generate(PROMPTS, params) == with_op
    one = LLMEngine(EngineConfig(cpu_aot_kernels="build", kv_cache_memory_gib=0.01,
                                 max_model_len=128, **dict(FLAGS, cpu_int4_activations="int8")),
                    load_model_source(MODEL))
    assert one.stats().cpu_aot_kernels["int4_w4a8"]["activations"] == "int8"
    assert all(layer.down.kernel == "cpu-int4-w4a8x1" for layer in one.runner.model.layers)
    assert all(len(t) == 12 for t in one.generate(PROMPTS, params))
    off = LLMEngine(EngineConfig(cpu_aot_kernels="off", kv_cache_memory_gib=0.01,
                                 max_model_len=128, **DEFAULT_FLAGS),
                    load_model_source(MODEL)).stats().cpu_aot_kernels["int4_w4a8"]
    assert (off["status"], off["reason"]) == ("off", "--cpu-aot-kernels off")
