"""The int8 rows kernel (``backend.layers.cpu_int8_rows``): built with the system's
compiler, it gives scale[n] * sum_k q[n, k] x[m, k] for every row count, width and thread
count it serves and refuses the rest; an engine on a CPU without AVX-512 runs its int8 LM
head through it for every call, with torch's int8 kernel's greedy tokens and no dense copy
of the head."""
from __future__ import annotations

import pytest
import torch

from backend.engine import aot_kernels, model_runner
from backend.engine.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.engine.sampling import SamplingParams
from backend.layers import cpu_int8_rows
from backend.weights.loader import load_model_source
from tests.backend.layers.test_cpu_aot import Counting, built_library

pytestmark = pytest.mark.skipif(cpu_int8_rows.why_not_here() is not None,
                                reason=str(cpu_int8_rows.why_not_here()))


@pytest.fixture(scope="module")
def kernel(tmp_path_factory) -> cpu_int8_rows.Int8Rows:
    return built_library(cpu_int8_rows, tmp_path_factory.mktemp("kernels"))


def weights(n: int, k: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    q = torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=gen)
    return q, torch.rand(n, generator=gen) * 0.02 + 1e-3


# rows: 1-3 (the 1- and 2-row blocks), 4 and beyond (groups of four, then the rest); output
# rows: whole blocks of 8 and tails; widths: one vector up to a model's
@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 7, 9])
@pytest.mark.parametrize("n, k", [(8, 8), (61, 64), (256, 576), (1000, 136)])
@pytest.mark.parametrize("threads", [1, 2])
def test_matches_the_float64_product(kernel, m, n, k, threads, monkeypatch):
    q, scale = weights(n, k, seed=m * 1000 + n)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(n))
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        got = kernel(x, q, scale)
    finally:
        torch.set_num_threads(before)
    want = (x.double() @ q.double().t()) * scale.double()
    assert got.shape == (m, n) and got.dtype == torch.float32
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5 * want.abs().max())


def test_agrees_with_torchs_int8_kernel_on_strided_rows(kernel):
    q, scale = weights(96, 64)
    x = torch.randn(64, 6)[:, 1:4].t()  # [3, 64], not contiguous
    torch.testing.assert_close(kernel(x, q, scale),
                               torch._weight_int8pack_mm(x.contiguous(), q, scale),
                               rtol=1e-5, atol=1e-5)


def test_what_it_does_not_serve_is_refused(kernel):
    q, scale = weights(16, 12)
    assert not cpu_int8_rows.Int8Rows.serves(q, scale)  # width not a multiple of 8
    with pytest.raises(ValueError, match="does not serve"):
        kernel(torch.randn(1, 12), q, scale)
    q, scale = weights(16, 16)
    assert cpu_int8_rows.Int8Rows.serves(q, scale)
    assert not cpu_int8_rows.Int8Rows.serves(q, scale.to(torch.bfloat16))
    with pytest.raises(ValueError, match="width 8 against the codes' 16"):
        kernel(torch.randn(2, 8), q, scale)
    assert not kernel.accepts(torch.randn(1, 16, dtype=torch.bfloat16))
    assert kernel.accepts(torch.randn(5, 16))


def test_ready_where_built_or_to_be_built_for_float32(tmp_path, monkeypatch):
    monkeypatch.setattr(aot_kernels, "kernels_dir", lambda: tmp_path)
    assert aot_kernels.int8_rows_ready("build", torch.float32)  # compiled at start
    assert not aot_kernels.int8_rows_ready("auto", torch.float32)  # none built
    (tmp_path / cpu_int8_rows.library_name()).write_bytes(b"")
    assert aot_kernels.int8_rows_ready("auto", torch.float32)
    assert not aot_kernels.int8_rows_ready("off", torch.float32)
    assert not aot_kernels.int8_rows_ready("auto", torch.bfloat16)
    monkeypatch.setattr(cpu_int8_rows, "why_not_here", lambda: "the CPU lacks AVX2")
    assert not aot_kernels.int8_rows_ready("build", torch.float32)


def test_an_int8_head_without_avx512_runs_it_for_every_call(tmp_path, monkeypatch):
    """A CPU without AVX-512 (pinned): the engine builds the kernel at start and the head
    runs it at one row and at two, with torch's kernel's tokens, and keeps no dense copy
    (every call has the kernel) though the layers keep theirs."""
    monkeypatch.setenv("FIRSTTOKEN_CACHE", str(tmp_path))
    monkeypatch.setattr(model_runner, "int8_head_rows_kernel", lambda: True)
    eng = LLMEngine(EngineConfig(cpu_aot_kernels="build", kv_cache_memory_gib=0.01,
                                 max_model_len=128, dtype="float32", weights_dtype="int8",
                                 lm_head_dtype="int8", prefill_dense_weights="on"),
                    load_model_source("synthetic:tiny"))
    s = eng.stats()
    path = tmp_path / "kernels" / cpu_int8_rows.library_name()
    assert (s.cpu_aot_kernels["lm_head"], s.cpu_aot_kernels["path"]) == ("built", str(path))
    assert s.lm_head_kernel == cpu_int8_rows.KERNEL_NAME
    head = eng.runner.model.lm_head
    assert head.prefill_weight is None and head.prefill_dense_bytes() == 0
    assert eng.runner.model.layers[0].qkv.prefill_weight is not None
    params = SamplingParams(max_tokens=10, ignore_eos=True, temperature=0)
    prompts = [[5, 9, 13, 2, 7], [40, 41, 42]]
    kernel, head.one_row = head.one_row, None
    want = eng.generate(prompts, params)  # torch's int8 kernel
    head.one_row = spy = Counting(kernel)
    assert eng.generate(prompts, params) == want
    assert spy.calls == 10  # the prefill's two rows, then 9 decode steps of two rows
