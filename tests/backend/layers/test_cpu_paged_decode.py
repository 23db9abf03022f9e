"""The CPU's paged decode attention (``backend.layers.cpu_paged_decode``): built with the
system's compiler, it reads decode rows' K/V through the block tables in place and gives the
torch path's output (gather + SDPA) for every head size, group, dtype, cache dtype (the
model's, int8), context length and thread count it serves; what it does not serve is
refused, never computed wrong."""
from __future__ import annotations

import pytest
import torch

from backend.layers import cpu_paged_decode
from backend.layers.attention import Attention, AttentionMetadata
from backend.layers.kv_cache import KVCache
from tests.backend.layers.test_cpu_aot import built_library

pytestmark = pytest.mark.skipif(cpu_paged_decode.why_not_here() is not None,
                                reason=str(cpu_paged_decode.why_not_here()))


@pytest.fixture(scope="module")
def kernel(tmp_path_factory) -> cpu_paged_decode.PagedDecode:
    return built_library(cpu_paged_decode, tmp_path_factory.mktemp("kernels"))


def case(lens: list[int], heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype,
         block_size: int = 16, seed: int = 0, kv_dtype: str = "auto"):
    """A one-layer cache (``kv_dtype``) with scattered blocks, its sdpa Attention and a
    decode step's metadata for rows of ``lens`` positions: (attention, q, meta)."""
    gen = torch.Generator().manual_seed(seed)
    width = -(-max(lens) // block_size)
    blocks = len(lens) * width + 3
    cache = KVCache(1, blocks, block_size, kv_heads, head_dim, dtype, kv_dtype,
                    torch.device("cpu"), kernel_layout=False)
    slots = torch.arange(blocks * block_size)
    k, v = (torch.randn(2, len(slots), kv_heads, head_dim, generator=gen) * 2).to(dtype)
    cache.write(0, slots, k, v)
    tables = torch.randperm(blocks, generator=gen)[:len(lens) * width].view(len(lens), width)
    attn = Attention(heads, kv_heads, head_dim, "sdpa", cache)
    q = (torch.randn(len(lens), heads, head_dim, generator=gen) * 2).to(dtype)
    d = len(lens)
    meta = AttentionMetadata(torch.zeros(d, dtype=torch.long), tables.to(torch.int32),
                             torch.tensor(lens, dtype=torch.int32),
                             torch.arange(d + 1, dtype=torch.int32), num_decode=d,
                             max_decode_context=max(lens), min_decode_context=min(lens))
    return attn, q, meta


def reference(attn: Attention, q: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
    """softmax(q k^T * scale) v in float64 over each row's own positions (an int8 cache's
    dequantised values)."""
    kv, bs = attn.kv_cache, attn.kv_cache.block_size
    cache = kv.gather(0, torch.arange(kv.data.shape[1]), torch.float32).double()
    out = []
    for row, n in enumerate(meta.context_lens.tolist()):
        slots = (meta.block_tables[row].long()[:, None] * bs + torch.arange(bs)).flatten()[:n]
        k = cache[slots, 0].repeat_interleave(attn.group, dim=1)  # [n, H, hd]
        v = cache[slots, 1].repeat_interleave(attn.group, dim=1)
        p = torch.softmax(torch.einsum("hd,nhd->hn", q[row].double(), k) * attn.scale, -1)
        out.append(torch.einsum("hn,nhd->hd", p, v))
    return torch.stack(out)


def call(kernel: cpu_paged_decode.PagedDecode, attn: Attention, q: torch.Tensor,
         meta: AttentionMetadata) -> torch.Tensor:
    cache = attn.kv_cache
    return kernel(q, cache.data[0], meta.block_tables, meta.context_lens, cache.block_size,
                  attn.scale, None if cache.scales is None else cache.scales[0])


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


@pytest.mark.parametrize("kv_dtype", ["auto", "int8"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("heads,kv_heads,head_dim", [(9, 3, 64), (4, 2, 16), (8, 1, 32),
                                                     (4, 4, 128), (16, 2, 256)])
def test_matches_the_torch_path_and_a_float64_reference(kernel, dtype, kv_dtype, heads,
                                                        kv_heads, head_dim):
    # lengths: one position, a partial block, whole blocks, many spans
    attn, q, meta = case([1, 13, 64, 300, 1000], heads, kv_heads, head_dim, dtype,
                         kv_dtype=kv_dtype)
    attn.prepare(meta)
    torch_path = attn._decode(0, q, meta)
    got = call(kernel, attn, q, meta)
    want = reference(attn, q, meta)
    assert got.dtype == dtype and got.shape == q.shape
    tol = 1e-5 if dtype == torch.float32 else 8e-3  # bf16: the output's rounding
    assert rel(got, want) < tol
    assert rel(got, want) <= rel(torch_path, want) * 1.5 + 1e-6
    # a row of one position is its V row itself
    slot = int(meta.block_tables[0, 0]) * attn.kv_cache.block_size
    v0 = attn.kv_cache.gather(0, torch.tensor([slot]), torch.float32)[0, 1]
    v0 = v0.repeat_interleave(attn.group, dim=0)
    torch.testing.assert_close(got[0].float(), v0.float(), rtol=tol, atol=tol)


@pytest.mark.parametrize("kv_dtype", ["auto", "int8"])
def test_every_thread_count_and_split_gives_the_same_answer(kernel, kv_dtype):
    attn, q, meta = case([1, 5, 64, 129, 700, 2047], 9, 3, 64, torch.float32, seed=3,
                         kv_dtype=kv_dtype)
    cache = attn.kv_cache
    args = (q, cache.data[0], meta.block_tables, meta.context_lens, cache.block_size,
            attn.scale, None if cache.scales is None else cache.scales[0])
    want = reference(attn, q, meta)
    before = torch.get_num_threads()
    try:
        for threads in (1, 2, 3, 8):
            torch.set_num_threads(threads)
            for span in (1, 16, 64, 4096):  # spans of one position up to one per row
                cpu_paged_decode.MIN_SPAN, saved = span, cpu_paged_decode.MIN_SPAN
                try:
                    assert rel(kernel(*args), want) < 1e-5, (threads, span)
                finally:
                    cpu_paged_decode.MIN_SPAN = saved
    finally:
        torch.set_num_threads(before)
    # repeated calls: the same bits
    assert torch.equal(kernel(*args), kernel(*args))


def test_block_sizes_and_rows_as_views_of_a_wider_step(kernel):
    for bs in (1, 8, 32):
        attn, q, meta = case([3, 40, 97], 4, 2, 64, torch.bfloat16, block_size=bs, seed=bs)
        # q as the attention layer gets it: a strided view of the step's q|k|v output
        wide = torch.cat([q, torch.zeros_like(q)], dim=1)
        got = kernel(wide[:, :4], attn.kv_cache.data[0], meta.block_tables,
                     meta.context_lens, bs, attn.scale)
        assert rel(got, reference(attn, q, meta)) < 8e-3


def test_shapes_it_does_not_serve_are_refused(kernel):
    serves = cpu_paged_decode.PagedDecode.serves
    bf16, f32, int8 = torch.bfloat16, torch.float32, torch.int8
    assert serves(bf16, bf16, 9, 3, 64) and serves(f32, f32, 32, 4, 128)
    assert serves(bf16, int8, 9, 3, 64) and serves(f32, int8, 9, 3, 64)
    assert not serves(bf16, f32, 9, 3, 64)  # a cache in another float dtype
    assert not serves(bf16, torch.uint8, 9, 3, 64)  # fp8 codes
    assert not serves(torch.float16, torch.float16, 9, 3, 64)  # no fp16 path
    assert not serves(bf16, bf16, 9, 3, 96)  # head size
    assert not serves(bf16, bf16, 18, 1, 64)  # 18 query heads to a KV head
    attn, q, meta = case([10], 4, 2, 64, torch.bfloat16)
    cache = attn.kv_cache.data[0]
    with pytest.raises(ValueError, match="context length < 1"):
        kernel(q, cache, meta.block_tables, torch.zeros(1, dtype=torch.int32), 16, 0.1)
    # a context past its table, a block past the cache or negative: refused, never read
    too_long = torch.tensor([meta.block_tables.shape[1] * 16 + 1], dtype=torch.int32)
    with pytest.raises(ValueError, match="past its block table"):
        kernel(q, cache, meta.block_tables, too_long, 16, 0.1)
    for bad in (cache.shape[0] // 16, -1):
        tables = meta.block_tables.clone()
        tables[0, 0] = bad
        with pytest.raises(ValueError, match="a block outside the cache"):
            kernel(q, cache, tables, meta.context_lens, 16, 0.1)
    with pytest.raises(ValueError, match="does not serve"):  # 3 query heads over 2 KV heads
        kernel(q[:, :3], cache, meta.block_tables, meta.context_lens, 16, 0.1)
    with pytest.raises(ValueError, match="contiguous cache in q's dtype"):
        kernel(q.float(), cache, meta.block_tables, meta.context_lens, 16, 0.1)
    with pytest.raises(ValueError, match="int32"):
        kernel(q, cache, meta.block_tables.long(), meta.context_lens, 16, 0.1)
    scales = torch.ones(cache.shape[:-1])
    with pytest.raises(ValueError, match="only it"):  # scales beside a bf16 cache
        kernel(q, cache, meta.block_tables, meta.context_lens, 16, 0.1, scales)
    codes = torch.zeros(cache.shape, dtype=torch.int8)
    with pytest.raises(ValueError, match="only it"):  # an int8 cache without its scales
        kernel(q, codes, meta.block_tables, meta.context_lens, 16, 0.1)


class CountingSteps:
    """The kernel with its steps' layer calls counted (``PagedDecode.step`` -> ``Step``)."""

    def __init__(self, kernel: cpu_paged_decode.PagedDecode) -> None:
        self.kernel, self.steps, self.calls = kernel, 0, 0

    def step(self, *args, **kwargs):
        self.steps += 1
        real = self.kernel.step(*args, **kwargs)

        def layer(*a):
            self.calls += 1
            return real(*a)
        return layer


def mixed_step(attn: Attention, meta: AttentionMetadata, prompt: int, seed: int):
    """``meta``'s decode rows (each writing its next position) plus one prefill chunk of
    ``prompt`` tokens in fresh blocks; (q, k, v) as strided views of one q|k|v output."""
    gen = torch.Generator().manual_seed(seed)
    cache, bs = attn.kv_cache, attn.kv_cache.block_size
    d, W = meta.num_decode, meta.block_tables.shape[1]
    used = set(meta.block_tables.flatten().tolist())
    free = [b for b in range(cache.num_blocks) if b not in used][:-(-prompt // bs)]
    table = torch.tensor(free + [0] * (W - len(free)), dtype=torch.int32)[None]
    lens = meta.context_lens
    slots = [int(meta.block_tables[r, (n - 1) // bs]) * bs + (n - 1) % bs
             for r, n in enumerate(lens.tolist())]
    slots += [free[p // bs] * bs + p % bs for p in range(prompt)]
    T, H, kvh, hd = d + prompt, attn.num_heads, attn.num_kv_heads, attn.head_dim
    wide = torch.randn(T, H + 2 * kvh, hd, generator=gen).to(cache.model_dtype)
    chunk = [(table, prompt)] if prompt else []
    step = AttentionMetadata(torch.tensor(slots),
                             torch.cat([meta.block_tables] + [t for t, _ in chunk]),
                             torch.cat([lens] + [torch.tensor([n], dtype=torch.int32)
                                                 for _, n in chunk]),
                             torch.tensor(list(range(d + 1)) + [T] * len(chunk),
                                          dtype=torch.int32),
                             num_decode=d, prefill_spans=[(d, n, n) for _, n in chunk],
                             max_decode_context=int(lens.max()) if d else None,
                             min_decode_context=int(lens.min()) if d else None)
    return step, wide[:, :H], wide[:, H:H + kvh], wide[:, H + kvh:]


@pytest.mark.parametrize("kv_dtype", ["auto", "int8"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_the_attention_layer_stores_and_attends_through_it(kernel, dtype, kv_dtype):
    """With the kernel attached every layer of a step is one call: it stores the step's K/V
    (the bits ``KVCache.write`` gives) and attends the decode rows; prefill chunks keep the
    torch path and read what it stored. Pure decode, mixed and prefill-only steps, q|k|v as
    strided views, against the torch path on a twin cache."""
    attn, _, meta = case([7, 50, 33], 4, 2, 64, dtype, kv_dtype=kv_dtype)
    twin, _, _ = case([7, 50, 33], 4, 2, 64, dtype, kv_dtype=kv_dtype)
    attn.cpu_decode = calls = CountingSteps(kernel)
    tol = 2e-5 if dtype == torch.float32 else 1e-2
    for n, prompt in enumerate((0, 21, 40)):
        step, q, k, v = mixed_step(attn, meta, prompt, seed=n)
        if n == 2:  # prefill only
            step, q, k, v = mixed_step(attn, AttentionMetadata(
                meta.slot_mapping[:0], meta.block_tables[:0], meta.context_lens[:0],
                meta.query_start_loc[:1], num_decode=0), prompt, seed=n)
        attn.prepare(step)
        assert "decode" not in step.extra  # no gather indices for the decode rows
        got = attn.forward(0, q, k, v, step)
        twin_step = AttentionMetadata(step.slot_mapping, step.block_tables, step.context_lens,
                                      step.query_start_loc, step.num_decode,
                                      step.prefill_spans, step.max_decode_context,
                                      step.min_decode_context)
        want = twin.forward(0, q, k, v, twin.prepare(twin_step))
        assert torch.equal(attn.kv_cache.data, twin.kv_cache.data)
        if kv_dtype == "int8":
            assert torch.equal(attn.kv_cache.scales, twin.kv_cache.scales)
        assert got.shape == want.shape == (q.shape[0], 4 * 64) and got.dtype == dtype
        assert rel(got, want) < tol, n
        assert calls.steps == calls.calls == n + 1  # one call for the layer
    # the math backend never takes it; fp8 and the kernels' int8 layout are not served
    def cache(kv_dtype, kernel_layout=False):
        return KVCache(1, 8, 16, 2, 64, torch.bfloat16, kv_dtype, torch.device("cpu"),
                       kernel_layout=kernel_layout)
    assert Attention(4, 2, 64, "sdpa", cache("int8")).cpu_decode_serves()
    assert not Attention(4, 2, 64, "sdpa", cache("int8", True)).cpu_decode_serves()
    assert not Attention(4, 2, 64, "sdpa", cache("fp8_e4m3")).cpu_decode_serves()
    assert not Attention(4, 2, 64, "math", attn.kv_cache).cpu_decode_serves()


def test_a_step_outside_the_cache_is_refused_before_any_layer(kernel):
    """A slot, context or block outside the cache is refused when the step is set up, and
    nothing is written; a layer's tensors of other shapes or dtypes are refused too."""
    attn, q, meta = case([7, 50], 4, 2, 64, torch.float32)
    attn.cpu_decode = kernel
    data = attn.kv_cache.data
    before = data.clone()
    slots = data.shape[1]
    bad_tables = meta.block_tables.clone()
    bad_tables[1, 0] = slots // 16
    for bad in (AttentionMetadata(torch.tensor([0, slots]), meta.block_tables,
                                  meta.context_lens, meta.query_start_loc, num_decode=2),
                AttentionMetadata(torch.tensor([0, -1]), meta.block_tables,
                                  meta.context_lens, meta.query_start_loc, num_decode=2),
                AttentionMetadata(meta.slot_mapping, bad_tables, meta.context_lens,
                                  meta.query_start_loc, num_decode=2),
                AttentionMetadata(meta.slot_mapping, meta.block_tables,
                                  torch.tensor([7, 0], dtype=torch.int32),
                                  meta.query_start_loc, num_decode=2)):
        with pytest.raises(ValueError, match="outside the cache"):
            attn.prepare(bad)
    assert torch.equal(data, before)
    attn.prepare(meta)
    step = meta.extra["cpu_step"]
    k = torch.zeros(2, 2, 64)
    out = torch.empty(2, 4, 64)
    with pytest.raises(ValueError, match="model dtype"):
        step(0, q, k.double(), k.double(), out)
    with pytest.raises(ValueError, match="model dtype"):
        step(0, q, k[:1], k[:1], out)  # fewer tokens than the step's
    with pytest.raises(ValueError, match="model dtype"):
        step(0, q, k, k, out[:1])
    assert torch.equal(data, before)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("kv_heads,head_dim", [(3, 64), (2, 16), (1, 256), (4, 128)])
def test_the_int8_store_writes_the_torch_writes_bits(kernel, dtype, kv_heads, head_dim):
    """A step's int8 store against ``KVCache.write`` (``kv_cache.quantise``): the same codes
    and scales, with K and V as strided views of a wider step output, rows of zeros and of
    one large value, and slots in any order; a slot outside the cache refused before
    anything is written."""
    gen = torch.Generator().manual_seed(head_dim)
    T = 37
    twins = [KVCache(1, 8, 16, kv_heads, head_dim, dtype, "int8", torch.device("cpu"),
                     kernel_layout=False) for _ in range(2)]
    wide = (torch.randn(T, 3 * kv_heads, head_dim, generator=gen) * 3).to(dtype)
    wide[3] = 0  # a zero row: scale 1e-12, codes 0
    wide[5, 0, 7] = 1e4
    k, v = wide[:, kv_heads:2 * kv_heads], wide[:, 2 * kv_heads:]  # strided views
    slots = torch.randperm(8 * 16, generator=gen)[:T]
    twins[0].write(0, slots, k, v)
    none = torch.zeros(0, dtype=torch.int32)

    def store(slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        step = kernel.step(twins[1].data, twins[1].scales, 16, slots, none.view(0, 1), none,
                           0, kv_heads, 1.0, dtype)  # no decode rows: the store alone
        step(0, k, k, v, None)
    store(slots, k, v)
    assert torch.equal(twins[0].data, twins[1].data)
    assert torch.equal(twins[0].scales, twins[1].scales)
    for bad in (twins[1].data.shape[1], -1):  # outside the cache: refused, nothing written
        before = twins[1].data.clone()
        with pytest.raises(ValueError, match="outside the cache"):
            store(torch.tensor([0, bad]), k[:2], v[:2])
        assert torch.equal(twins[1].data, before)


def test_an_int8_cache_is_written_and_read_through_the_library(kernel):
    """Attention.forward over an int8 cache with the library attached stores through it
    (the bits ``KVCache.write`` gives) and attends through the paged kernel."""
    attn, q, meta = case([7, 50], 4, 2, 64, torch.bfloat16, kv_dtype="int8")
    twin, _, _ = case([7, 50], 4, 2, 64, torch.bfloat16, kv_dtype="int8")
    attn.cpu_decode = kernel
    gen = torch.Generator().manual_seed(1)
    k, v = torch.randn(2, 2, 2, 64, generator=gen).to(torch.bfloat16)
    meta.slot_mapping = torch.tensor([attn.kv_cache.scratch_slot, 5])
    attn.prepare(meta)
    out = attn.forward(0, q, k, v, meta)
    twin.kv_cache.write(0, meta.slot_mapping, k, v)
    assert torch.equal(attn.kv_cache.data, twin.kv_cache.data)
    assert torch.equal(attn.kv_cache.scales, twin.kv_cache.scales)
    assert rel(out.view(2, 4, 64), reference(attn, q, meta)) < 8e-3


@pytest.mark.parametrize("kv_dtype", ["auto", "int8"])
def test_the_engines_start_check_takes_it_and_refuses_a_wrong_one(kernel, kv_dtype):
    """``aot_kernels._checked_decode``, run where the engine loads the library: a step
    through the layer against the torch path on twin caches. The real kernel passes; one
    whose attention is off (the softmax scale doubled) or whose store writes other values
    is refused."""
    from backend.engine import aot_kernels
    attn = Attention(9, 3, 64, "sdpa", KVCache(2, 8, 16, 3, 64, torch.bfloat16, kv_dtype,
                                                torch.device("cpu"), kernel_layout=False))
    assert aot_kernels._checked_decode(kernel, attn) is kernel

    class Wrong:
        path = kernel.path

        def __init__(self, scale: float, store_scale: float) -> None:
            self.scale, self.store_scale = scale, store_scale

        def step(self, *args):
            args = list(args)
            args[8] *= self.scale  # the softmax scale
            real = kernel.step(*args)
            return lambda i, q, k, v, out: real(i, q, k * self.store_scale,
                                                v * self.store_scale, out)

    for wrong in (Wrong(2.0, 1.0), Wrong(1.0, 0.5)):
        with pytest.raises(RuntimeError, match="disagrees with the torch path"):
            aot_kernels._checked_decode(wrong, attn)
