"""The one-row int8 GEMV compiled ahead of time (AOTInductor): built into a directory once,
loaded, equal to torch's int8 kernel and to the dequantised reference, used by an int8 layer
only for the calls it was built for."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from backend.layers import cpu_aot, cpu_paged_decode, cpu_w4a8
from backend.layers.linear import ONE_ROW_AOT_KERNEL, Int8Linear
from tests.backend.layers.test_quant_linear import quantised_layer

N, K = 320, 64


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """(directory, package path, seconds) of one bf16 build (5-25 s: inductor runs g++)."""
    directory = tmp_path_factory.mktemp("kernels")
    path, seconds = cpu_aot.build(directory, N, K, torch.bfloat16)
    return directory, path, seconds


def test_package_is_named_for_its_shape_dtype_torch_and_cpu(built):
    directory, path, _ = built
    assert path == directory / cpu_aot.package_name(N, K, torch.bfloat16)
    assert path.name.startswith(f"int8-gemv-{N}x{K}-bfloat16-torch")
    assert path.name.endswith(f"-{cpu_aot.cpu_tag()}.pt2") and len(cpu_aot.cpu_tag()) == 8
    assert cpu_aot.package_name(N, K, torch.float32) != path.name
    assert cpu_aot.package_name(N + 1, K, torch.bfloat16) != path.name
    assert [p.name for p in directory.iterdir() if p.suffix == ".pt2"] == [path.name]


def test_build_again_is_a_no_op_and_load_finds_only_what_was_built(built, tmp_path):
    directory, path, _ = built
    mtime = path.stat().st_mtime_ns
    again, seconds = cpu_aot.build(directory, N, K, torch.bfloat16)
    assert again == path and path.stat().st_mtime_ns == mtime and seconds < 1
    assert cpu_aot.load(tmp_path, N, K, torch.bfloat16) is None
    assert cpu_aot.load(directory, N, K, torch.float32) is None
    with pytest.raises(ValueError, match="int8 GEMV"):
        cpu_aot.build(tmp_path, N, K, torch.int8)


def test_a_package_is_loaded_once_in_a_fresh_process_before_this_one(built, tmp_path,
                                                                     monkeypatch):
    """A package loads here only after a fresh process loaded it (a ``.loads`` file records
    the pass): one whose loader crashes that process, or fails, is refused with the reason,
    and this process goes on."""
    directory, path, _ = built
    cpu_aot.load(directory, N, K, torch.bfloat16)
    assert path.with_name(path.name + ".loads").is_file()
    copy = tmp_path / path.name
    copy.write_bytes(path.read_bytes())
    crash = "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"
    monkeypatch.setattr(cpu_aot, "_LOAD_PROBE", crash)
    with pytest.raises(RuntimeError, match="crashes the process that loads it on this host "
                                           r"\(signal 11"):
        cpu_aot.load(tmp_path, N, K, torch.bfloat16)
    monkeypatch.setattr(cpu_aot, "_LOAD_PROBE", "raise SystemExit('no loader here')")
    with pytest.raises(RuntimeError, match="does not load on this host: no loader here"):
        cpu_aot.load(tmp_path, N, K, torch.bfloat16)
    assert not copy.with_name(copy.name + ".loads").exists()
    # the recorded pass: not probed again (the probe would crash)
    monkeypatch.setattr(cpu_aot, "_LOAD_PROBE", crash)
    assert cpu_aot.load(directory, N, K, torch.bfloat16) is not None
    # a cache it cannot write to: checked, loaded, the pass not recorded
    monkeypatch.setattr(cpu_aot, "_LOAD_PROBE", "pass")

    def read_only(self, *args, **kwargs):
        raise PermissionError(f"read-only: {self}")
    monkeypatch.setattr(Path, "touch", read_only)
    assert cpu_aot.load(tmp_path, N, K, torch.bfloat16) is not None
    assert not copy.with_name(copy.name + ".loads").exists()


@pytest.mark.parametrize("seed", [0, 1])
def test_matches_torchs_int8_kernel_and_the_dequantised_reference(built, seed):
    directory, _, _ = built
    kernel = cpu_aot.load(directory, N, K, torch.bfloat16)
    gen = torch.Generator().manual_seed(seed)
    layer = quantised_layer("int8", torch.randn(N, K, generator=gen) * 0.05, torch.bfloat16)
    x = torch.randn(1, K, generator=gen).to(torch.bfloat16)
    got = kernel(x, layer.q, layer.scale)
    assert got.shape == (1, N) and got.dtype == torch.bfloat16
    want = torch._weight_int8pack_mm(x, layer.q, layer.scale)
    ref = x.float() @ layer.dequantized().t()
    scale = ref.abs().max().item()
    # fp32 sums rounded once to bf16: within a bf16 step of the exact product
    torch.testing.assert_close(got.float(), ref, atol=8e-3 * scale, rtol=0)
    torch.testing.assert_close(got.float(), want.float(), atol=1.6e-2 * scale, rtol=0)
    assert (got.float() - ref).abs().mean() <= (want.float() - ref).abs().mean() * 1.05


def built_library(module, directory):
    """One of our C++ libraries (``module``: its ``load``, ``build``, ``library_name``)
    built into the empty ``directory``, a second build finding it there, then loaded."""
    assert module.load(directory) is None  # nothing built yet
    module.build(directory)
    assert module.build(directory) < 1.0  # there already: nothing compiled
    loaded = module.load(directory)
    assert loaded is not None and loaded.path.name == module.library_name()
    return loaded


class Counting:
    """A loaded kernel that counts its calls (its other methods pass through uncounted)."""

    def __init__(self, kernel: cpu_aot.OneRowInt8) -> None:
        self.kernel, self.calls = kernel, 0

    def __getattr__(self, name: str):
        return getattr(self.kernel, name)

    def __call__(self, *args: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return self.kernel(*args)


def test_the_layer_runs_it_for_one_contiguous_row_of_its_dtype_only(built):
    directory, _, _ = built
    kernel = cpu_aot.load(directory, N, K, torch.bfloat16)
    gen = torch.Generator().manual_seed(2)
    b = torch.randn(N, generator=gen)
    layer = quantised_layer("int8", torch.randn(N, K, generator=gen) * 0.05, torch.bfloat16,
                            bias=b)
    assert isinstance(layer, Int8Linear) and layer.one_token_kernel(False) == layer.kernel
    layer.one_row = counting = Counting(kernel)
    assert layer.one_token_kernel(False) == ONE_ROW_AOT_KERNEL
    x = torch.randn(1, K, generator=gen).to(torch.bfloat16)
    y = layer(x)
    assert counting.calls == 1
    ref = x.float() @ layer.dequantized().t() + b.to(torch.bfloat16).float()
    torch.testing.assert_close(y.float(), ref, atol=1e-2 * ref.abs().max().item(), rtol=0)
    rows3 = torch.randn(3, K, generator=gen).to(torch.bfloat16)
    strided = torch.randn(1, 2 * K, generator=gen).to(torch.bfloat16)[:, ::2]
    assert not kernel.accepts(rows3) and not kernel.accepts(strided)
    assert not kernel.accepts(torch.randn(1, K, generator=gen))  # float32
    ref = rows3.float() @ layer.dequantized().t() + b.to(torch.bfloat16).float()
    torch.testing.assert_close(layer(rows3).float(), ref,  # torch's kernel
                               atol=3e-2 * ref.abs().max().item(), rtol=0)
    assert counting.calls == 1


@pytest.mark.parametrize("flags,want", [
    ("fpu avx2 fma f16c avx512f avx512bw avx512vl avx512_vnni", "avx512-vnni"),
    ("fpu avx2 fma f16c avx512f", "avx2"),  # AVX-512F without VNNI: the AVX2 build
    ("fpu avx2 fma f16c", "avx2"),
    ("fpu avx2 f16c", None),  # no FMA: neither
])
def test_a_cpu_gets_the_first_build_its_flags_allow(flags, want, monkeypatch):
    monkeypatch.setattr(cpu_aot, "cpu_info", lambda: {"flags": flags})
    isa = cpu_aot.first_isa(cpu_w4a8.ISAS)
    assert (isa[0] if isa else None) == want
    if want is None:  # refused plainly, never built with flags this CPU lacks
        assert "the CPU lacks" in cpu_w4a8.why_not_here()
    else:
        assert set(isa[2]) <= set(cpu_w4a8.flags())
    # the paged decode kernel needs AVX-512F alone for its wide build
    decode = cpu_aot.first_isa(cpu_paged_decode.ISAS)
    want_decode = "avx512f" if "avx512f" in flags else want and "avx2"
    assert (decode[0] if decode else None) == want_decode
