"""Triton kernels against the math reference on small shapes (CPU: TRITON_INTERPRET=1).

Contexts of 1 token, exactly one block and one past it; GQA groups 1/4/8; head_dim 64/128;
one and several splits; a prefill chunk starting mid-block after a prefix-cache hit; int8
and fp8 caches against the dequantised reference; a mixed step (decodes + two prefill
chunks) through ``Attention`` against the math backend.
"""
from __future__ import annotations

import pytest
import torch

from backend.layers import fused_ops
from backend.layers.attention import Attention, AttentionMetadata, math_attention
from backend.layers.kv_cache import KVCache

triton_attention = pytest.importorskip("backend.layers.triton_attention")

BS = 16  # tokens per block
TOL = {torch.float32: 2e-4, torch.bfloat16: 3e-2}


def _cache(kvh: int, hd: int, dtype: torch.dtype, kind: str, blocks: int = 12) -> KVCache:
    return KVCache(1, blocks, BS, kvh, hd, dtype, kind, torch.device("cpu"))


def _tables(lens: list[int], blocks: int, gen: torch.Generator) -> torch.Tensor:
    """Scrambled, disjoint block tables [S, W] int32 covering each context."""
    need = [-(-n // BS) for n in lens]
    order = torch.randperm(blocks, generator=gen).tolist()
    width, rows, i = max(need), [], 0
    for nb in need:
        rows.append(order[i:i + nb] + [0] * (width - nb))
        i += nb
    return torch.tensor(rows, dtype=torch.int32)


def _slots(table: torch.Tensor, positions: range) -> torch.Tensor:
    return torch.tensor([int(table[p // BS]) * BS + p % BS for p in positions])


def _fill(cache: KVCache, tables: torch.Tensor, lens: list[int], gen: torch.Generator) -> None:
    """Random K/V for every context position, written by the store kernel."""
    kvh, hd = cache.data.shape[3], cache.data.shape[4]
    for row, n in enumerate(lens):
        k = torch.randn(n, kvh, hd, generator=gen).to(cache.model_dtype)
        v = torch.randn(n, kvh, hd, generator=gen).to(cache.model_dtype)
        triton_attention.store_kv(k, v, _slots(tables[row], range(n)), cache.data[0],
                                  None if cache.scales is None else cache.scales[0],
                                  cache.kv_cache_dtype, BS)


def _context(cache: KVCache, table: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Dequantised [kvh, n, hd] K and V of one sequence, through the reference gather."""
    kv = cache.gather(0, _slots(table, range(n)))  # [n, 2, kvh, hd]
    return kv[:, 0].transpose(0, 1), kv[:, 1].transpose(0, 1)


def _reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, prefix: int) -> torch.Tensor:
    """q: [n, H, hd] at positions prefix..prefix+n-1; k, v: [kvh, ctx, hd] -> [n, H, hd]."""
    n, H, hd = q.shape
    group = H // k.shape[0]
    k, v = k.repeat_interleave(group, 0), v.repeat_interleave(group, 0)
    ctx = k.shape[1]
    blocked = torch.arange(ctx)[None, :] > torch.arange(prefix, prefix + n)[:, None]
    mask = torch.zeros(n, ctx).masked_fill_(blocked, -torch.inf)
    return math_attention(q.transpose(0, 1).float(), k.float(), v.float(), mask,
                          hd ** -0.5).transpose(0, 1)


@pytest.mark.parametrize("kind,atol", [("auto", 0), ("int8", 0), ("fp8_e4m3", 0)])
def test_store_kernel_matches_the_torch_write(kind: str, atol: int) -> None:
    gen = torch.Generator().manual_seed(0)
    a, b = _cache(2, 64, torch.float32, kind), _cache(2, 64, torch.float32, kind)
    k = torch.randn(20, 2, 64, generator=gen) * torch.logspace(-2, 2, 20).view(20, 1, 1)
    v = torch.randn(20, 2, 64, generator=gen)
    slots = torch.randperm(12 * BS, generator=gen)[:20]
    triton_attention.store_kv(k, v, slots, a.data[0], None if a.scales is None else a.scales[0],
                              kind, BS)
    b.write(0, slots, k, v)
    if kind == "fp8_e4m3":  # compare values: rounding may differ at ties
        back_a, back_b = a.gather(0, slots), b.gather(0, slots)
        amax = torch.stack((k, v), 1).abs().amax(-1, keepdim=True)
        assert ((back_a - back_b).abs() <= amax / 8).all()
    else:
        assert (a.data.float() - b.data.float()).abs().max() <= atol
    if a.scales is not None:
        torch.testing.assert_close(a.scales, b.scales)


@pytest.mark.parametrize("T", [5, 8 * BS])
def test_int8_store_rounds_halves_to_even(T: int) -> None:
    """Values halfway between two codes go to the even one, as torch.round: K through the
    token kernel, V through it (5 tokens) and through the whole-block path (128)."""
    halves = torch.tensor([0.5, 1.5, 2.5, -0.5, -2.5, 126.5, -125.5, 127.0])
    x = halves.repeat(T, 2, 8)  # [T, kvh, 64]: |max| 127 makes the scale exactly 1
    cache = _cache(2, 64, torch.float32, "int8", blocks=T // BS + 2)
    slots = torch.arange(BS, BS + T)  # whole blocks in order from slot BS on
    triton_attention.store_kv(x, x, slots, cache.data[0], cache.scales[0], "int8", BS)
    back = cache.gather(0, slots)  # codes times a scale of 1
    expected = torch.tensor([0.0, 2.0, 2.0, -0.0, -2.0, 126.0, -126.0, 127.0]).repeat(8)
    assert torch.equal(cache.scales[0][:, :, slots], torch.ones(2, 2, T))
    assert torch.equal(back, expected.expand_as(back))


@pytest.mark.parametrize("hd,lone", [(64, 37), (64, 42), (72, 37)])
def test_int8_v_of_a_long_step_is_stored_by_its_own_kernel_as_the_torch_write(hd: int,
                                                                              lone: int) -> None:
    """A step of ``V_T_APART_TOKENS`` tokens or more stores int8 V in its own kernel
    (``_store_v_transposed_kernel``): bit for bit the torch write's codes and scales.
    A run of slots starting mid-block (its whole blocks written as rows, from step indices
    on a window's start and, after 42 decodes, off it), lone slots, a window cut by the
    step's end; head_dim a power of two (whole blocks as rows) and not (every byte apart,
    runs wrapping rows)."""
    gen = torch.Generator().manual_seed(4)
    blocks = 16
    a, b = (_cache(2, hd, torch.bfloat16, "int8", blocks) for _ in range(2))
    order = torch.randperm(blocks * BS, generator=gen)
    run = torch.arange(3 * BS + 5, 9 * BS + 2)  # a prefill chunk: consecutive slots
    decodes = order[~torch.isin(order, run)][:lone]  # scattered slots
    slots = torch.cat((decodes, run))
    T = slots.shape[0]
    assert T >= triton_attention.V_T_APART_TOKENS and T % BS
    k = torch.randn(T, 2, hd, generator=gen).to(torch.bfloat16)
    v = (torch.randn(T, 2, hd, generator=gen) * torch.logspace(-3, 1, T).view(T, 1, 1)
         ).to(torch.bfloat16)
    triton_attention.store_kv(k, v, slots, a.data[0], a.scales[0], "int8", BS)
    b.write(0, slots, k, v)
    assert torch.equal(a.data, b.data)
    torch.testing.assert_close(a.scales, b.scales, rtol=0, atol=0)


@pytest.mark.parametrize("kind", ["auto", "int8", "fp8_e4m3"])
@pytest.mark.parametrize("dtype,heads,kvh,hd", [(torch.float32, 4, 2, 64),
                                               (torch.bfloat16, 9, 3, 64),
                                               (torch.bfloat16, 8, 8, 128)])
def test_rope_in_the_store_equals_rope_then_store(kind: str, dtype: torch.dtype, heads: int,
                                                  kvh: int, hd: int) -> None:
    """RoPE applied by the store kernel leaves q and the cache exactly as the separate RoPE
    kernel followed by a plain store does (same roundings), and k as it was."""
    gen = torch.Generator().manual_seed(3)
    T = 5
    qkv = torch.randn(T, (heads + 2 * kvh) * hd, generator=gen).to(dtype)  # q | k | v rows
    angles = torch.rand(T, hd // 2, generator=gen) * 50
    emb = torch.cat((angles, angles), dim=-1)
    cos, sin = emb.cos().to(dtype), emb.sin().to(dtype)
    slots = torch.randperm(12 * BS, generator=gen)[:T]
    split = lambda x: (x[:, :heads * hd].view(T, heads, hd),  # noqa: E731
                       x[:, heads * hd:].view(T, 2, kvh, hd)[:, 0],
                       x[:, heads * hd:].view(T, 2, kvh, hd)[:, 1])
    a, b = _cache(kvh, hd, dtype, kind), _cache(kvh, hd, dtype, kind)
    separate, fused = qkv.clone(), qkv.clone()
    fused_ops.rope_triton_(separate[:, :(heads + kvh) * hd].view(T, heads + kvh, hd), cos, sin)
    q, k, v = split(separate)
    triton_attention.store_kv(k, v, slots, a.data[0], None if a.scales is None else a.scales[0],
                              kind, BS)
    q, k, v = split(fused)
    triton_attention.store_kv(k, v, slots, b.data[0], None if b.scales is None else b.scales[0],
                              kind, BS, rope=(q, cos, sin))
    assert torch.equal(fused[:, :heads * hd], separate[:, :heads * hd])  # q rotated in place
    assert torch.equal(fused[:, heads * hd:], qkv[:, heads * hd:])  # k, v untouched
    assert torch.equal(b.data, a.data)
    if a.scales is not None:
        assert torch.equal(b.scales, a.scales)
    assert not torch.equal(fused[:, :heads * hd], qkv[:, :heads * hd])  # RoPE did something


@pytest.mark.parametrize("dtype,group,hd,splits,heads_first", [
    (torch.float32, 1, 64, 1, False), (torch.float32, 4, 128, 4, True),
    (torch.bfloat16, 8, 64, 2, False), (torch.bfloat16, 1, 128, 8, True),
    (torch.bfloat16, 1, 128, 1, True)])
def test_paged_decode_matches_reference(dtype: torch.dtype, group: int, hd: int,
                                        splits: int, heads_first: bool) -> None:
    """Both grid orders (sequence or KV head fastest), with and without split merges."""
    gen = torch.Generator().manual_seed(1)
    kvh, lens = 2, [1, BS, BS + 1, 40]
    cache = _cache(kvh, hd, dtype, "auto")
    tables = _tables(lens, cache.num_blocks, gen)
    _fill(cache, tables, lens, gen)
    q = torch.randn(len(lens), kvh * group, hd, generator=gen).to(dtype)
    out = torch.empty_like(q)
    triton_attention.paged_decode(q, cache.data[0], None, tables, torch.tensor(
        lens, dtype=torch.int32), out, hd ** -0.5, BS, "auto", splits, block_n=16,
        heads_first=heads_first)
    for i, n in enumerate(lens):
        k, v = _context(cache, tables[i], n)
        ref = _reference(q[i:i + 1], k, v, n - 1)[0]
        torch.testing.assert_close(out[i].float(), ref.float(), atol=TOL[dtype],
                                   rtol=TOL[dtype])


@pytest.mark.parametrize("splits", [1, 4])
def test_paged_decode_default_tiles(splits: int) -> None:
    """With no tile given, an unsplit grid takes the unsplit tile and a split one the
    other (``decode_tile``), and both give the reference result."""
    assert triton_attention.decode_tile("auto", 1) != triton_attention.decode_tile("auto", 4)
    gen = torch.Generator().manual_seed(3)
    kvh, lens = 2, [BS - 3, 2 * BS + 5, 70]
    cache = _cache(kvh, 64, torch.bfloat16, "auto")
    tables = _tables(lens, cache.num_blocks, gen)
    _fill(cache, tables, lens, gen)
    q = torch.randn(len(lens), kvh, 64, generator=gen).to(torch.bfloat16)
    out = torch.empty_like(q)
    triton_attention.paged_decode(q, cache.data[0], None, tables, torch.tensor(
        lens, dtype=torch.int32), out, 64 ** -0.5, BS, "auto", splits)
    for i, n in enumerate(lens):
        k, v = _context(cache, tables[i], n)
        ref = _reference(q[i:i + 1], k, v, n - 1)[0]
        torch.testing.assert_close(out[i].float(), ref.float(), atol=TOL[torch.bfloat16],
                                   rtol=TOL[torch.bfloat16])


@pytest.mark.parametrize("kind,hd,block_n", [("int8", 64, 16), ("int8", 72, 64),
                                             ("fp8_e4m3", 64, 16)])
def test_quantised_decode_and_prefill_match_the_dequantised_reference(kind: str, hd: int,
                                                                      block_n: int) -> None:
    """int8 V transposed within blocks: head_dim a multiple of the block size and not
    (runs of tokens wrapping rows), tiles past the context's last block."""
    gen = torch.Generator().manual_seed(2)
    kvh, group, lens = 2, 4, [BS + 1, 37]
    cache = _cache(kvh, hd, torch.bfloat16, kind)
    tables = _tables(lens, cache.num_blocks, gen)
    _fill(cache, tables, lens, gen)
    scales, lens_t = cache.scales[0], torch.tensor(lens, dtype=torch.int32)
    q = torch.randn(len(lens), kvh * group, hd, generator=gen).to(torch.bfloat16)
    out = torch.empty_like(q)
    triton_attention.paged_decode(q, cache.data[0], scales, tables, lens_t, out, hd ** -0.5,
                                  BS, kind, 2, block_n=block_n)
    chunk = 9  # the last 9 positions of sequence 1 as a prefill chunk over its prefix
    qp = torch.randn(chunk, kvh * group, hd, generator=gen).to(torch.bfloat16)
    outp = torch.empty_like(qp)
    triton_attention.paged_prefill(qp, cache.data[0], scales, tables[1:], lens_t[1:],
                                   torch.tensor([0, chunk], dtype=torch.int32), outp,
                                   hd ** -0.5, BS, kind, block_m=16, block_n=16)
    for i, n in enumerate(lens):
        k, v = _context(cache, tables[i], n)
        ref = _reference(q[i:i + 1], k, v, n - 1)[0]
        torch.testing.assert_close(out[i].float(), ref.float(), atol=3e-2, rtol=3e-2)
    k, v = _context(cache, tables[1], lens[1])
    torch.testing.assert_close(outp.float(), _reference(qp, k, v, lens[1] - chunk).float(),
                               atol=3e-2, rtol=3e-2)


def test_int8_cache_in_fp16_keeps_small_v_scales(monkeypatch) -> None:
    """On the GPU an int8 cache is attended in fp16 (``_int8_to_fp16``). Its V scales may be
    far below fp16's normal range once multiplied into the probabilities (here |V| ~ 1e-6):
    the tile's largest scale goes outside the dot, so the result keeps its precision. Run
    in the interpreter as the GPU runs it (fp16 dots, not the fp32 ones of UPCAST)."""
    monkeypatch.setattr(triton_attention, "_INTERPRETING", False)
    gen = torch.Generator().manual_seed(5)
    kvh, group, hd, lens = 2, 1, 64, [3 * BS + 5, 41]
    cache = _cache(kvh, hd, torch.bfloat16, "int8")
    tables = _tables(lens, cache.num_blocks, gen)
    for row, n in enumerate(lens):
        k = torch.randn(n, kvh, hd, generator=gen).to(torch.bfloat16)
        v = (torch.randn(n, kvh, hd, generator=gen) * 1e-6).to(torch.bfloat16)
        triton_attention.store_kv(k, v, _slots(tables[row], range(n)), cache.data[0],
                                  cache.scales[0], "int8", BS)
    lens_t = torch.tensor(lens, dtype=torch.int32)
    q = (torch.randn(len(lens), kvh * group, hd, generator=gen) * 0.3).to(torch.bfloat16)
    out = torch.empty_like(q)
    triton_attention.paged_decode(q, cache.data[0], cache.scales[0], tables, lens_t, out,
                                  hd ** -0.5, BS, "int8", 1, block_n=32)
    for i, n in enumerate(lens):
        k, v = _context(cache, tables[i], n)
        ref = _reference(q[i:i + 1], k, v, n - 1)[0]
        torch.testing.assert_close(out[i].float() * 1e6, ref.float() * 1e6, atol=2e-2,
                                   rtol=2e-2)


@pytest.mark.parametrize("dtype,group,hd", [(torch.float32, 1, 64), (torch.bfloat16, 4, 128)])
def test_paged_prefill_over_a_prefix_hit_mid_block(dtype: torch.dtype, group: int,
                                                   hd: int) -> None:
    """Two chunks in one launch: a fresh prompt of 17 tokens, and 12 tokens after a cached
    prefix of 21 (the chunk starts in the middle of the second block)."""
    gen = torch.Generator().manual_seed(3)
    kvh, prefixes, chunks = 2, [0, 21], [17, 12]
    lens = [p + c for p, c in zip(prefixes, chunks)]
    cache = _cache(kvh, hd, dtype, "auto")
    tables = _tables(lens, cache.num_blocks, gen)
    _fill(cache, tables, lens, gen)
    T = sum(chunks) + 1  # one unrelated row first (a decode's place), left untouched
    q = torch.randn(T, kvh * group, hd, generator=gen).to(dtype)
    out = torch.zeros_like(q)
    starts = torch.tensor([1, 1 + chunks[0], T], dtype=torch.int32)
    triton_attention.paged_prefill(q, cache.data[0], None, tables, torch.tensor(
        lens, dtype=torch.int32), starts, out, hd ** -0.5, BS, "auto",
        block_m=16, block_n=16)
    assert out[0].abs().max() == 0
    for i in range(2):
        rows = slice(int(starts[i]), int(starts[i + 1]))
        k, v = _context(cache, tables[i], lens[i])
        ref = _reference(q[rows], k, v, prefixes[i])
        torch.testing.assert_close(out[rows].float(), ref.float(), atol=TOL[dtype],
                                   rtol=TOL[dtype])


def test_paged_prefill_with_empty_chunk_slots() -> None:
    """A graphed step's chunk slots: chunks of 33, 0, 16 and 0 rows (the empty ones at zero
    context, as padded) after two decode rows; one query tile range over all of them
    (block_m 16: 3 + 0 + 1 tiles, their starts spaced by the slots). Each real chunk equals
    the reference; rows outside the chunks stay untouched."""
    gen = torch.Generator().manual_seed(5)
    kvh, group, hd = 2, 2, 64
    chunks, prefixes = [33, 0, 16, 0], [0, 0, 5, 0]
    lens = [p + c for p, c in zip(prefixes, chunks)]
    cache = _cache(kvh, hd, torch.float32, "auto")
    real = [i for i, c in enumerate(chunks) if c]
    given = _tables([lens[i] for i in real], cache.num_blocks, gen)
    tables = torch.zeros(len(chunks), given.shape[1], dtype=torch.int32)
    tables[real] = given
    _fill(cache, tables[real], [lens[i] for i in real], gen)
    starts = torch.tensor([2, 35, 35, 51, 51], dtype=torch.int32)
    T = 53  # two rows first (decodes' places) and two after, left untouched
    q = torch.randn(T, kvh * group, hd, generator=gen)
    out = torch.zeros_like(q)
    triton_attention.paged_prefill(q, cache.data[0], None, tables, torch.tensor(
        lens, dtype=torch.int32), starts, out, hd ** -0.5, BS, "auto", block_m=16,
        block_n=16)
    assert out[:2].abs().max() == 0 and out[51:].abs().max() == 0
    for i in real:
        rows = slice(int(starts[i]), int(starts[i + 1]))
        k, v = _context(cache, tables[i], lens[i])
        torch.testing.assert_close(out[rows], _reference(q[rows], k, v, prefixes[i]),
                                   atol=TOL[torch.float32], rtol=TOL[torch.float32])


def test_mixed_step_through_the_attention_layer_matches_math() -> None:
    """Two decodes and two prefill chunks (one after a prefix hit) in one step: the triton
    backend against the math backend, each writing the step's K/V into its own cache."""
    gen = torch.Generator().manual_seed(4)
    kvh, group, hd = 2, 2, 64
    prior = [BS, 5, 0, 19]  # tokens already cached: decode, decode, fresh chunk, prefix hit
    new = [1, 1, 10, 7]
    lens = [p + n for p, n in zip(prior, new)]
    tables = _tables(lens, 12, gen)
    caches = {b: _cache(kvh, hd, torch.float32, "auto") for b in ("triton", "math")}
    for cache in caches.values():
        _fill(cache, tables, prior, torch.Generator().manual_seed(5))
    T = sum(new)
    q = torch.randn(T, kvh * group, hd, generator=gen)
    k = torch.randn(T, kvh, hd, generator=gen)
    v = torch.randn(T, kvh, hd, generator=gen)
    slots = torch.cat([_slots(tables[i], range(prior[i], lens[i])) for i in range(4)])
    starts = [0, 1, 2, 12, 19]
    outs = {}
    for name, cache in caches.items():
        attn = Attention(kvh * group, kvh, hd, name, cache)
        meta = attn.prepare(AttentionMetadata(
            slot_mapping=slots, block_tables=tables,
            context_lens=torch.tensor(lens, dtype=torch.int32),
            query_start_loc=torch.tensor(starts, dtype=torch.int32), num_decode=2,
            prefill_spans=[(2, 10, lens[2]), (12, 7, lens[3])], max_decode_context=BS + 1,
            min_decode_context=6))
        outs[name] = attn.forward(0, q, k, v, meta)
    torch.testing.assert_close(outs["triton"], outs["math"], atol=2e-4, rtol=2e-4)


def test_the_attention_layer_hands_dependent_launch_to_its_kernels(monkeypatch) -> None:
    """``dependent_launch`` (the Triton step ops' setting) reaches the store and decode
    launches, and the step's output does not depend on it (off CUDA no kernel takes it)."""
    gen = torch.Generator().manual_seed(6)
    kvh, group, hd = 2, 2, 64
    lens = [9, 17]
    tables = _tables(lens, 4, gen)
    seen = {"store": [], "decode": []}
    store, decode = triton_attention.store_kv, triton_attention.paged_decode
    monkeypatch.setattr(triton_attention, "store_kv", lambda *a, **kw: (
        seen["store"].append(a[8] if len(a) > 8 else kw.get("dependent_launch", False)),
        store(*a, **kw))[1])
    monkeypatch.setattr(triton_attention, "paged_decode", lambda *a, **kw: (
        seen["decode"].append(kw.get("dependent_launch", False)), decode(*a, **kw))[1])
    q = torch.randn(2, kvh * group, hd, generator=gen)
    k = torch.randn(2, kvh, hd, generator=gen)
    v = torch.randn(2, kvh, hd, generator=gen)
    slots = torch.cat([_slots(tables[i], [lens[i] - 1]) for i in range(2)])
    outs = []
    for flag in (False, True):
        cache = _cache(kvh, hd, torch.float32, "auto")
        _fill(cache, tables, [n - 1 for n in lens], torch.Generator().manual_seed(7))
        attn = Attention(kvh * group, kvh, hd, "triton", cache)
        meta = attn.prepare(AttentionMetadata(
            slot_mapping=slots, block_tables=tables,
            context_lens=torch.tensor(lens, dtype=torch.int32),
            query_start_loc=torch.tensor([0, 1, 2], dtype=torch.int32), num_decode=2,
            max_decode_context=max(lens), min_decode_context=min(lens)))
        seen["store"].clear()  # the context written by _fill
        outs.append(attn.forward(0, q, k, v, meta, None, flag))
        assert seen["store"] == [flag] and seen["decode"][-1] == flag
    torch.testing.assert_close(outs[0], outs[1], atol=0, rtol=0)


@pytest.mark.parametrize("kind,dtype,hd,splits,block_n", [
    ("auto", torch.float32, 64, 1, 16), ("auto", torch.bfloat16, 128, 4, 32),
    ("int8", torch.bfloat16, 64, 1, 32), ("int8", torch.bfloat16, 72, 2, 16),
    ("fp8_e4m3", torch.bfloat16, 64, 1, 16)])
def test_decode_rows_path_matches_the_dot_path_and_the_reference(kind: str,
                                                                 dtype: torch.dtype, hd: int,
                                                                 splits: int,
                                                                 block_n: int) -> None:
    """One query head per KV head on the CUDA cores (``rows``) against the tl.dot path and
    the dequantised reference: contexts of one token, of a block and past one, tiles past
    the last block, int8 V transposed with and without runs wrapping rows (hd 72)."""
    gen = torch.Generator().manual_seed(7)
    kvh, lens = 3, [1, BS, BS + 1, 45]
    cache = _cache(kvh, hd, dtype, kind)
    tables = _tables(lens, cache.num_blocks, gen)
    _fill(cache, tables, lens, gen)
    scales = None if cache.scales is None else cache.scales[0]
    lens_t = torch.tensor(lens, dtype=torch.int32)
    q = torch.randn(len(lens), kvh, hd, generator=gen).to(dtype)
    outs = {}
    for rows in (0, 1, 2, 3):
        outs[rows] = torch.empty_like(q)
        triton_attention.paged_decode(q, cache.data[0], scales, tables, lens_t, outs[rows],
                                      hd ** -0.5, BS, kind, splits, block_n=block_n,
                                      rows=rows)
    tol = 2e-4 if dtype == torch.float32 else 3e-2
    for i, n in enumerate(lens):
        k, v = _context(cache, tables[i], n)
        ref = _reference(q[i:i + 1], k, v, n - 1)[0]
        for rows in (1, 2, 3):
            torch.testing.assert_close(outs[rows][i].float(), ref.float(), atol=tol, rtol=tol)
            torch.testing.assert_close(outs[rows][i].float(), outs[0][i].float(), atol=tol,
                                       rtol=tol)


def _spy_decode_launches(monkeypatch, *keys: str) -> list[tuple]:
    """Every ``_decode_kernel`` launch from here on runs as before and appends its keyword
    arguments ``keys`` as a tuple to the list returned."""
    launched: list[tuple] = []
    real = triton_attention._decode_kernel

    class Spy:
        def __getitem__(self, grid):
            def launch(*args, **kw):
                launched.append(tuple(kw[k] for k in keys))
                return real[grid](*args, **kw)
            return launch

    monkeypatch.setattr(triton_attention, "_decode_kernel", Spy())
    return launched


def test_int8_decode_defaults_to_the_rows_path_on_unsplit_grids_only(monkeypatch) -> None:
    """``DECODE_ROWS``: an int8 cache's unsplit grid of one query head per KV head takes
    the CUDA-core path by default (one row, no padding), a split grid and a GQA group the
    tl.dot path (the group padded to 16 rows); each against the reference."""
    launched = _spy_decode_launches(monkeypatch, "ROWS", "G_PAD")
    gen = torch.Generator().manual_seed(11)
    kvh, hd, lens = 2, 64, [BS + 3, 30]
    cache = _cache(kvh, hd, torch.bfloat16, "int8")
    tables = _tables(lens, cache.num_blocks, gen)
    _fill(cache, tables, lens, gen)
    lens_t = torch.tensor(lens, dtype=torch.int32)
    unsplit_way = triton_attention.DECODE_ROWS["int8"][1]
    for group, splits, want in ((1, 1, (unsplit_way, 1)), (1, 2, (0, 16)), (4, 1, (0, 16))):
        q = torch.randn(len(lens), kvh * group, hd, generator=gen).to(torch.bfloat16)
        out = torch.empty_like(q)
        triton_attention.paged_decode(q, cache.data[0], cache.scales[0], tables, lens_t, out,
                                      hd ** -0.5, BS, "int8", splits, block_n=16)
        assert launched.pop() == want
        for i, n in enumerate(lens):
            k, v = _context(cache, tables[i], n)
            ref = _reference(q[i:i + 1], k, v, n - 1)[0]
            torch.testing.assert_close(out[i].float(), ref.float(), atol=3e-2, rtol=3e-2)
    assert unsplit_way > 0


def test_decode_splits_outside_graphs() -> None:
    """Inside CUDA graphs (no host context) the splits fill the GPU for the batch. A step
    run outside them decodes a bf16 or int8 cache unsplit up to ``EAGER_UNSPLIT_MAX_TOKENS``
    (the merge's launch costs the host more than the split saves the GPU) and splits longer
    contexts as graphs do; fp8 caches split as graphs do, capped by the context's tiles."""
    cpu, most = torch.device("cpu"), triton_attention.EAGER_UNSPLIT_MAX_TOKENS
    graphed = triton_attention.decode_splits(1, 1, None, cpu)  # 2 "SMs" off CUDA: 4
    assert graphed == 4
    assert triton_attention.decode_splits(1, 1, 544, cpu) == 1
    assert triton_attention.decode_splits(1, 1, most, cpu) == 1
    assert triton_attention.decode_splits(1, 1, most + 1, cpu) == graphed
    assert triton_attention.decode_splits(1, 1, 544, cpu, "int8") == 1
    assert triton_attention.decode_splits(1, 1, most + 1, cpu, "int8") == graphed
    assert triton_attention.decode_splits(1, 1, 544, cpu, "fp8_e4m3") == graphed
    assert triton_attention.decode_splits(1, 1, 100, cpu, "fp8_e4m3") == 2  # two 64-token tiles
    assert triton_attention.decode_splits(8, 1, 100 * most, cpu) == 1  # the batch fills it


def test_a_kind_listed_for_eager_unsplit_takes_its_small_batch_tile(monkeypatch) -> None:
    """``EAGER_UNSPLIT``: a quantised kind listed there decodes unsplit outside graphs up to
    ``EAGER_UNSPLIT_MAX_TOKENS``; a grid of fewer than two programs a multiprocessor (the
    CPU counts 2) then takes the listed tile and rows mode, a larger one the kind's unsplit
    tile. Each against the reference."""
    cpu, most = torch.device("cpu"), triton_attention.EAGER_UNSPLIT_MAX_TOKENS
    default = triton_attention.EAGER_UNSPLIT["int8"]
    small = ((16, 2, 2), 0)
    monkeypatch.delitem(triton_attention.EAGER_UNSPLIT, "int8")
    assert triton_attention.decode_splits(1, 1, 544, cpu, "int8") > 1  # not listed: splits
    monkeypatch.setitem(triton_attention.EAGER_UNSPLIT, "int8", small)
    assert triton_attention.decode_splits(1, 1, 544, cpu, "int8") == 1
    assert triton_attention.decode_splits(1, 1, most + 1, cpu, "int8") > 1
    assert triton_attention.decode_splits(1, 1, None, cpu, "int8") > 1  # graphs split
    launched = _spy_decode_launches(monkeypatch, "BLOCK_N", "num_warps", "num_stages", "ROWS")
    gen = torch.Generator().manual_seed(12)
    kvh, hd = 1, 64
    unsplit_n, unsplit_w, unsplit_s = triton_attention.DECODE_TILES["int8"][1]
    big = (unsplit_n, unsplit_w, unsplit_s, triton_attention.DECODE_ROWS["int8"][1])
    for entry, lens, want in ((small, [BS + 3], (16, 2, 2, 0)),
                              (default, [BS + 3], (*default[0], default[1])),
                              (small, [BS + 3, 30, 7, 21], big)):
        monkeypatch.setitem(triton_attention.EAGER_UNSPLIT, "int8", entry)
        cache = _cache(kvh, hd, torch.bfloat16, "int8")
        tables = _tables(lens, cache.num_blocks, gen)
        _fill(cache, tables, lens, gen)
        q = torch.randn(len(lens), kvh, hd, generator=gen).to(torch.bfloat16)
        out = torch.empty_like(q)
        triton_attention.paged_decode(q, cache.data[0], cache.scales[0], tables,
                                      torch.tensor(lens, dtype=torch.int32), out, hd ** -0.5,
                                      BS, "int8", 1)
        assert launched.pop() == want
        for i, n in enumerate(lens):
            k, v = _context(cache, tables[i], n)
            ref = _reference(q[i:i + 1], k, v, n - 1)[0]
            torch.testing.assert_close(out[i].float(), ref.float(), atol=3e-2, rtol=3e-2)


@pytest.mark.parametrize("dtype,group,splits", [
    (torch.bfloat16, 1, 1), (torch.bfloat16, 1, 8), (torch.float32, 4, 4),
    (torch.bfloat16, 8, 2)])
def test_early_decode_reads_the_steps_row_and_q_after_the_wait(monkeypatch, dtype, group,
                                                               splits) -> None:
    """``early``: the first tile's rows are loaded before the wait for the previous kernel
    (the step's K/V store). Here that wait is where the step's K/V row and q come to hold
    their values (garbage before it, and again after the program releases the next kernel),
    so any of them read before it shows in the output; and the result is the same bits as
    without ``early``, on contexts of one token, of one tile and of several, and empty
    splits."""
    gen = torch.Generator().manual_seed(5)
    kvh, hd, lens = 2, 64, [1, BS, BS + 1, 40, 70]
    cache = _cache(kvh, hd, dtype, "auto", blocks=16)
    tables = _tables(lens, cache.num_blocks, gen)
    _fill(cache, tables, lens, gen)
    q = torch.randn(len(lens), kvh * group, hd, generator=gen).to(dtype)
    lens_t = torch.tensor(lens, dtype=torch.int32)
    want = torch.empty_like(q)
    triton_attention.paged_decode(q, cache.data[0], None, tables, lens_t, want, hd ** -0.5,
                                  BS, "auto", splits, block_n=16, early=False)
    rows = torch.stack([_slots(tables[i], range(n - 1, n))[0] for i, n in enumerate(lens)])
    good_kv, good_q = cache.data[0][rows].clone(), q.clone()

    def spoil(_pdl=None) -> None:
        cache.data[0][rows] = torch.nan
        q.fill_(torch.nan)

    def settle(_pdl=None) -> None:
        cache.data[0][rows] = good_kv
        q.copy_(good_q)

    monkeypatch.setattr(triton_attention, "pdl_wait", settle)
    monkeypatch.setattr(triton_attention, "pdl_release", spoil)
    spoil()
    got = torch.empty_like(q)
    triton_attention.paged_decode(q, cache.data[0], None, tables, lens_t, got, hd ** -0.5,
                                  BS, "auto", splits, block_n=16, early=True)
    assert torch.equal(got, want)
    settle()
    for i, n in enumerate(lens):
        k, v = _context(cache, tables[i], n)
        ref = _reference(q[i:i + 1], k, v, n - 1)[0]
        torch.testing.assert_close(got[i].float(), ref.float(), atol=TOL[dtype],
                                   rtol=TOL[dtype])
