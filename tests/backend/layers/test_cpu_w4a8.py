"""The CPU's int4 x int8 op (``backend.layers.cpu_w4a8``): built with the system's compiler
against torch's headers, it gives exactly the product its scheme defines (each row rounded
to int8 per block of 32, in one or two parts, times the codes, plus the mins times the
block sums) for every dtype and row count; two parts come within float rounding of the
float product; an int4 layer with it attached runs its few-row calls through it, and what it
does not serve is refused."""
from __future__ import annotations

import pytest
import torch

from backend.layers import cpu_dequant, cpu_w4a8
from backend.layers.linear import Int4Linear, Linear

pytestmark = pytest.mark.skipif(cpu_w4a8.why_not_here() is not None,
                                reason=str(cpu_w4a8.why_not_here()))


@pytest.fixture(scope="module", autouse=True)
def op(tmp_path_factory) -> None:
    directory = tmp_path_factory.mktemp("kernels")
    if not cpu_w4a8.loaded():
        assert not cpu_w4a8.load(directory)  # nothing built there yet
    cpu_w4a8.build(directory)
    assert cpu_w4a8.build(directory) < 1.0  # there already: nothing compiled
    assert cpu_w4a8.load(directory) and cpu_w4a8.loaded()


def weights(N: int, K: int, G: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 16, (N, K), dtype=torch.uint8, generator=gen)
    scale = torch.rand(N, K // G, generator=gen) * 0.02 + 1e-3
    lo = -8 * scale + torch.randn(N, K // G, generator=gen) * 1e-3
    return codes, scale, lo


def scheme(x: torch.Tensor, codes: torch.Tensor, scale_min: torch.Tensor,
           parts: int) -> torch.Tensor:
    """The op's arithmetic, float32 rounding then float64 sums: x rounded per block of 32
    in ``parts`` int8 parts (half to even, as the CPU's conversion), the codes' dot products
    scaled, plus the mins times each block's sum."""
    M, K = x.shape
    rest = x.float().view(M, K // 32, 32)
    total, terms = rest.double().sum(-1), []
    for _ in range(parts):
        amax = rest.abs().amax(-1, keepdim=True)
        d = amax / 127
        inv = torch.where(amax > 0, 127 / amax, torch.zeros_like(amax))
        q = torch.round(rest * inv)
        terms.append((q.double(), d.double()))
        rest = rest - q * d
    N = codes.shape[0]
    sm = scale_min.double().permute(0, 3, 1, 2).reshape(N, K // 32, 2)
    c = codes.double().view(N, K // 32, 32)
    out = total @ sm[..., 1].t()
    for q, d in terms:
        out = out + torch.einsum("mbk,nbk,mb,nb->mn", q, c, d.squeeze(-1), sm[..., 0])
    return out


@pytest.mark.parametrize("N,K,G", [(960, 576, 32), (576, 1536, 64), (48, 128, 128)])
def test_pack_round_trips(N, K, G):
    codes, scale, lo = weights(N, K, G)
    tiles, scale_min = cpu_w4a8.pack(codes, scale, lo, G)
    assert tiles.shape == (N // 16, K // 8, 64) and tiles.dtype == torch.uint8
    assert scale_min.shape == (N // 16, K // 32, 2, 16) and scale_min.dtype == torch.float16
    want = (codes.float() * scale.half().float().repeat_interleave(G, 1)
            + lo.half().float().repeat_interleave(G, 1))
    assert torch.equal(cpu_w4a8.dequantize(tiles, scale_min), want)


@pytest.mark.parametrize("N,K,G", [(960, 576, 32), (576, 1536, 64), (48, 128, 128)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float16])
@pytest.mark.parametrize("through", ["op", "torch"])
def test_dense_weights_from_the_ops_codes(N, K, G, dtype, through, monkeypatch):
    """A layer without torch's packing dequantises from the op's layout: W.T in ``dtype``
    in torch's convention, (codes - 8) * scale + zero with zero = lo + 8 * scale from the
    fp16 pairs in float32, both rounded to ``dtype``, in one addcmul; the per-call pass (in
    blocks of rows) multiplies by the same bits; ``unpack`` gives the codes back. The
    library's dequantising op and the torch ops (where it is not loaded) give the same
    bits."""
    if through == "torch":
        monkeypatch.setattr(cpu_w4a8, "_dequant_op", None)
    else:
        assert cpu_w4a8._dequant_op is not None
    codes, scale, lo = weights(N, K, G)
    tiles, scale_min = cpu_w4a8.pack(codes, scale, lo, G)
    s32, l32 = (v.half().float() for v in (scale, lo))
    zero = (l32 + 8 * s32).to(dtype).repeat_interleave(G, 1)
    want = torch.addcmul(zero, (codes.float() - 8).to(dtype),
                         s32.to(dtype).repeat_interleave(G, 1)).t().contiguous()
    assert torch.equal(cpu_w4a8.dense_t(tiles, scale_min, dtype), want)
    x = torch.randn(7, K).to(dtype)
    assert torch.equal(cpu_w4a8.dense_matmul(x, tiles, scale_min), x @ want)
    got_codes, got_scale, got_lo = cpu_w4a8.unpack(tiles, scale_min, G)
    assert torch.equal(got_codes, codes)
    assert torch.equal(got_scale, scale.half().float()) and torch.equal(got_lo, lo.half().float())


def test_the_dequantising_op_writes_a_range_of_tiles_into_a_view():
    """Tiles t0..t1 into a strided view (the copy's columns): its columns only, and bad
    shapes or ranges refused plainly."""
    codes, scale, lo = weights(96, 64, 32)
    tiles, scale_min = cpu_w4a8.pack(codes, scale, lo, 32)
    whole = cpu_w4a8.dense_t(tiles, scale_min, torch.bfloat16)  # [64, 96]
    out = torch.full((64, 96), 7.0, dtype=torch.bfloat16)
    torch.ops.firsttoken.int4_w4a8_dequant_t(tiles, scale_min, 2, 4, out[:, 32:64])
    assert torch.equal(out[:, 32:64], whole[:, 32:64])
    assert bool((out[:, :32] == 7).all()) and bool((out[:, 64:] == 7).all())
    with pytest.raises(RuntimeError, match="out of 0..6"):
        torch.ops.firsttoken.int4_w4a8_dequant_t(tiles, scale_min, 5, 7, out[:, :32])
    with pytest.raises(RuntimeError, match="out must be"):
        torch.ops.firsttoken.int4_w4a8_dequant_t(tiles, scale_min, 0, 2, out[:, :16])


@pytest.mark.parametrize("parts", [1, 2])
@pytest.mark.parametrize("M", [1, 2, 3, 4, 5, 8, 9])
def test_float32_rows_give_the_schemes_product(M, parts):
    N, K, G = 960, 576, 32
    codes, scale, lo = weights(N, K, G, seed=M)
    tiles, scale_min = cpu_w4a8.pack(codes, scale, lo, G)
    x = torch.randn(M, K, generator=torch.Generator().manual_seed(M)) * 3
    x[:, 5] = 50.0  # an outlier in one block
    x[0, 32:64] = 0.0  # a block of zeros
    got = cpu_w4a8.matmul(x, tiles, scale_min, parts).double()
    want = scheme(x, codes, scale_min, parts)
    assert ((got - want).abs().max() / want.abs().max()).item() < 1e-5


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_two_parts_come_within_float_rounding(dtype):
    N, K, G = 576, 1536, 32
    codes, scale, lo = weights(N, K, G)
    tiles, scale_min = cpu_w4a8.pack(codes, scale, lo, G)
    W = cpu_w4a8.dequantize(tiles, scale_min).double()
    x = (torch.randn(6, K, generator=torch.Generator().manual_seed(1)) * 2).to(dtype)
    x[:, 7] = 40
    want = x.double() @ W.t()
    rel = {p: ((cpu_w4a8.matmul(x, tiles, scale_min, p).double() - want).norm()
               / want.norm()).item() for p in (1, 2)}
    assert cpu_w4a8.matmul(x, tiles, scale_min, 2).dtype == dtype
    # the output's own rounding bounds two parts; one part keeps the activations' 8 bits
    assert rel[2] < {torch.float32: 5e-4, torch.float16: 1e-3, torch.bfloat16: 4e-3}[dtype]
    assert rel[1] > 2 * rel[2] if dtype == torch.float32 else rel[1] < 0.05


def test_rows_are_independent_of_the_batch():
    N, K, G = 960, 576, 32
    tiles, scale_min = cpu_w4a8.pack(*weights(N, K, G), G)
    x = torch.randn(8, K).to(torch.bfloat16)
    whole = cpu_w4a8.matmul(x, tiles, scale_min, 2)
    for r in range(8):
        assert torch.equal(cpu_w4a8.matmul(x[r:r + 1], tiles, scale_min, 2), whole[r:r + 1])


def test_no_rows_and_refusals():
    N, K, G = 64, 128, 32
    tiles, scale_min = cpu_w4a8.pack(*weights(N, K, G), G)
    assert cpu_w4a8.matmul(torch.zeros(0, K), tiles, scale_min).shape == (0, N)
    with pytest.raises(RuntimeError, match="does not match"):
        cpu_w4a8.matmul(torch.zeros(1, K + 32), tiles, scale_min)
    with pytest.raises(RuntimeError, match="scale_min"):
        cpu_w4a8.matmul(torch.zeros(1, K), tiles, scale_min.float())
    with pytest.raises(RuntimeError, match="parts"):
        cpu_w4a8.matmul(torch.zeros(1, K), tiles, scale_min, 3)
    with pytest.raises(RuntimeError, match="bfloat16"):
        cpu_w4a8.matmul(torch.zeros(1, K, dtype=torch.float64), tiles, scale_min)
    with pytest.raises(ValueError, match="packing needs"):
        cpu_w4a8.pack(*weights(40, K, G), G)
    assert not cpu_w4a8.serves(40, 128, 32) and not cpu_w4a8.serves(64, 128, 16)


def int4_layer(N: int = 192, K: int = 256, G: int = 32, bias: bool = False) -> Int4Linear:
    layer = Int4Linear(N, K, bias, torch.device("cpu"), torch.bfloat16, G)
    layer.load_rows(slice(None), torch.randn(N, K, generator=torch.Generator().manual_seed(3)))
    if bias:
        layer.bias.copy_(torch.randn(N))
    return layer


@pytest.mark.parametrize("bias", [False, True])
def test_an_int4_layer_runs_its_few_row_calls_through_the_op(bias):
    layer = int4_layer(bias=bias)
    if not layer.w4a8_serves():
        pytest.skip("torch's int4 packing is in a layout cpu_dequant does not read")
    x = torch.randn(4, layer.in_features).to(torch.bfloat16)
    before, gen = layer(x), Linear.generation
    layer.attach_w4a8(2)
    assert Linear.generation > gen and layer.kernel == "cpu-int4-w4a8x2"
    tiles = layer.w4a8_codes
    fn, kind = layer.few_rows_fn()
    got = layer(x)
    # the op's own row thresholds: it keeps more rows from the dense copies than torch's
    assert kind == layer.cpu_kind == "int4-w4a8" and torch.equal(fn(x), got)
    assert cpu_dequant.few_rows_limit("int4-w4a8") > cpu_dequant.few_rows_limit("int4")
    want = (cpu_w4a8.matmul(x, tiles, layer.w4a8_scale_min.view(torch.float16), 2)
            + (layer.bias if bias else 0))
    assert torch.equal(got, want.to(got.dtype))
    assert cpu_w4a8.PARTS["int8x2"] == 2
    # the same weights as torch's kernel multiplies by: only the activations' rounding
    assert ((got.float() - before.float()).norm() / before.float().norm()).item() < 1e-2
    # many rows still go the packed-kernel way (or the dense copy)
    many = torch.randn(cpu_dequant.DENSE_MIN_ROWS["int4-w4a8"], layer.in_features
                       ).to(torch.bfloat16)
    assert not torch.equal(layer(many)[:4], cpu_w4a8.matmul(many, tiles, layer.w4a8_scale_min
                                                            .view(torch.float16), 2)[:4])
    layer.detach_w4a8()
    assert not layer.w4a8 and "w4a8_codes" not in dict(layer.named_buffers())
    assert torch.equal(layer(x), before) and layer.cpu_kind == "int4"


def test_the_ops_copy_follows_a_reload_and_dtype_moves():
    layer = int4_layer()
    if not layer.w4a8_serves():
        pytest.skip("torch's int4 packing is in a layout cpu_dequant does not read")
    layer.attach_w4a8(1)
    old = layer.w4a8_codes.clone()
    layer.load_rows(slice(None), torch.randn(layer.out_features, layer.in_features))
    assert layer.w4a8 and not torch.equal(layer.w4a8_codes, old)
    codes = cpu_dequant.int4_unpack(layer.packed, layer.out_features, layer.in_features)
    assert torch.equal(cpu_w4a8.pack(codes, torch.ones(1, 1).expand(codes.shape[0], 8),
                                     torch.zeros(codes.shape[0], 8), 32)[0], layer.w4a8_codes)
    bits = layer.w4a8_scale_min.clone()
    layer.to(torch.float32)  # floating buffers move; the scales' fp16 bits do not
    assert torch.equal(layer.w4a8_scale_min, bits)
    assert layer(torch.randn(2, layer.in_features)).dtype == torch.float32


def test_released_torch_packing_serves_every_row_count():
    """Once the op is attached, torch's packing of the same codes goes: the op serves few
    rows, the dense copy (rebuilt from the op's codes) many, and without a copy many-row
    calls dequantise from those codes to the same values; detaching rebuilds torch's packing
    from them."""
    layer = int4_layer(N=128, K=256)
    if not layer.w4a8_serves():
        pytest.skip("torch's int4 packing is in a layout cpu_dequant does not read")
    gen = torch.Generator().manual_seed(5)
    xs = {m: torch.randn(m, layer.in_features, generator=gen).to(torch.bfloat16)
          for m in (4, 40, 160)}
    torch_kernel = {m: layer(x) for m, x in xs.items()}
    layer.keep_prefill_dense(True)
    layer.attach_w4a8(2)
    before = {m: layer(x) for m, x in xs.items()}
    with pytest.raises(ValueError, match="not attached"):
        int4_layer().release_torch_packing()
    gen_before = Linear.generation
    freed = layer.release_torch_packing()
    assert freed == 128 * 128 + (256 // 32) * 128 * 2 * 2 and Linear.generation > gen_before
    assert not layer.torch_packed and "packed" not in dict(layer.named_buffers())
    assert layer.release_torch_packing() == 0
    assert torch.equal(layer(xs[4]), before[4])  # the op's calls as they were
    tiles, sm = layer.w4a8_codes, layer.w4a8_scale_min.view(torch.float16)
    assert torch.equal(layer.dequantized(), cpu_w4a8.dequantize(tiles, sm))
    copy = layer.prefill_weight
    assert torch.equal(copy.to_dense().t() if copy.is_mkldnn else copy,
                       cpu_w4a8.dense_t(tiles, sm, torch.bfloat16))
    with_copy = {m: layer(xs[m]) for m in (40, 160)}
    # no copy: 160 rows dequantise from the op's codes, to the copy's values
    layer.keep_prefill_dense(False)
    many = layer(xs[160])
    assert torch.equal(many, cpu_w4a8.dense_matmul(xs[160], tiles, sm))
    assert torch.equal(many, xs[160] @ cpu_w4a8.dense_t(tiles, sm, torch.bfloat16))
    assert torch.equal(many, with_copy[160])
    for m, y in with_copy.items():  # torch's bf16 scale / zero against the op's fp16 pairs
        rel = (y.float() - torch_kernel[m].float()).norm() / torch_kernel[m].float().norm()
        assert rel.item() < 1e-2
    layer.keep_prefill_dense(True)
    # a reload packs the op's codes only; the copy follows them
    layer.load_rows(slice(None), torch.randn(128, 256, generator=gen))
    assert layer.w4a8 and not layer.torch_packed and "packed" not in layer._buffers
    tiles, sm = layer.w4a8_codes, layer.w4a8_scale_min.view(torch.float16)
    copy = layer.prefill_weight
    dense = copy.to_dense().t() if copy.is_mkldnn else copy
    assert torch.equal(dense, cpu_w4a8.dense_t(tiles, sm, torch.bfloat16))
    # back to torch's kernel: its packing rebuilt from the op's codes and fp16 scales
    reloaded = layer.dequantized()
    layer.attach_w4a8(1)  # attached already: one part now, the same codes and fp16 pairs
    assert layer.w4a8_parts == 1 and layer.kernel == f"{cpu_w4a8.KERNEL_NAME}x1"
    assert layer.w4a8_codes is tiles and torch.equal(layer._w4a8_scale_min(), sm)
    layer.detach_w4a8()
    assert layer.torch_packed and not layer.w4a8 and "packed" in layer._buffers
    # within torch's bf16 roundings of its scales, zeros and their sum (2^-8 each)
    assert bool(((layer.dequantized() - reloaded).abs() <= (reloaded.abs() + 1) / 64).all())
    copy = layer.prefill_weight  # kept: the values torch's packing reads
    assert torch.equal(copy.to_dense().t() if copy.is_mkldnn else copy, cpu_dequant.int4_dense_t(
        layer.packed, layer.scale_zero, layer.group_size, torch.bfloat16))
    layer.attach_w4a8(1)  # and attached again from it
    assert torch.equal(layer.w4a8_codes, tiles)
