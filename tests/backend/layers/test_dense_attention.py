"""The dense (sdpa) attention path on the CPU: a long prefill chunk runs its queries in
tiles of ``CPU_PREFILL_Q_TILE`` positions, each against the keys up to its last position,
and gives what one causal softmax over the whole context gives, with or without context
cached before the chunk and beside a decode row in the same step."""
from __future__ import annotations

import pytest
import torch

from backend.layers import attention as attention_module
from backend.layers.attention import Attention, AttentionMetadata
from backend.layers.kv_cache import KVCache

KVH, GROUP, HD, BS = 2, 3, 16, 16


def _reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int) -> torch.Tensor:
    """q: [n, H, hd] at positions start.., k, v: [start + n, kvh, hd] -> [n, H * hd]."""
    n, ctx = q.shape[0], k.shape[0]
    kk = k.repeat_interleave(GROUP, dim=1).transpose(0, 1)  # [H, ctx, hd]
    vv = v.repeat_interleave(GROUP, dim=1).transpose(0, 1)
    scores = q.transpose(0, 1) @ kk.transpose(1, 2) * HD ** -0.5  # [H, n, ctx]
    blocked = torch.arange(ctx) > torch.arange(start, start + n).unsqueeze(1)
    probs = scores.masked_fill(blocked, -torch.inf).softmax(-1)
    return (probs @ vv).transpose(0, 1).reshape(n, -1)


@pytest.mark.parametrize("prior", [0, 40])
def test_a_long_chunk_in_query_tiles_matches_one_causal_softmax(prior, monkeypatch) -> None:
    monkeypatch.setattr(attention_module, "CPU_PREFILL_Q_TILE", 128)
    gen = torch.Generator().manual_seed(prior)
    n, decode_ctx = 300, 21  # 300 new positions: tiles of 128, 128 and 44
    blocks = -(-(prior + n) // BS)
    cache = KVCache(1, 64, BS, KVH, HD, torch.float32, "auto", torch.device("cpu"))
    # the decode row owns blocks 0-1, the chunk blocks 2.. (in reverse: pages, not a range)
    chunk_blocks = list(range(2 + blocks - 1, 1, -1))
    tables = torch.zeros(2, blocks, dtype=torch.int32)
    tables[0, :2] = torch.tensor([0, 1])
    tables[1] = torch.tensor(chunk_blocks)

    def slots(row: int, positions: range) -> torch.Tensor:
        return torch.tensor([int(tables[row, p // BS]) * BS + p % BS for p in positions],
                            dtype=torch.long)

    keys = {r: torch.randn(c, KVH, HD, generator=gen) for r, c in ((0, decode_ctx), (1, prior + n))}
    values = {r: torch.randn(c, KVH, HD, generator=gen) for r, c in ((0, decode_ctx), (1, prior + n))}
    for r, ctx in ((0, decode_ctx - 1), (1, prior)):  # what earlier steps stored
        cache.write(0, slots(r, range(ctx)), keys[r][:ctx], values[r][:ctx])
    q = torch.randn(1 + n, KVH * GROUP, HD, generator=gen)
    attn = Attention(KVH * GROUP, KVH, HD, "sdpa", cache)
    meta = attn.prepare(AttentionMetadata(
        slot_mapping=torch.cat([slots(0, range(decode_ctx - 1, decode_ctx)),
                                slots(1, range(prior, prior + n))]),
        block_tables=tables, context_lens=torch.tensor([decode_ctx, prior + n], dtype=torch.int32),
        query_start_loc=torch.tensor([0, 1, 1 + n], dtype=torch.int32), num_decode=1,
        prefill_spans=[(1, n, prior + n)], max_decode_context=decode_ctx,
        min_decode_context=decode_ctx))
    pieces = meta.extra["prefill"][0][3]
    assert [(p0, p1) for p0, p1, _ in pieces] == [(0, 128), (128, 256), (256, 300)]
    out = attn.forward(0, q, torch.cat([keys[0][-1:], keys[1][prior:]]),
                       torch.cat([values[0][-1:], values[1][prior:]]), meta)
    torch.testing.assert_close(out[1:], _reference(q[1:], keys[1], values[1], prior),
                               atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out[:1], _reference(q[:1], keys[0], values[0], decode_ctx - 1),
                               atol=1e-5, rtol=1e-5)


def test_int8_cpu_decode_rows_attend_in_float32_from_the_threshold(monkeypatch) -> None:
    """Decode rows of a bf16 model over an int8 CPU cache: from ``F32_DECODE_MIN_TOKENS``
    gathered tokens they attend the dequantised values in float32 (the masks of shorter rows
    too) and return the model dtype; below it, in bf16 as before. The float32 path is at least
    as close to a float32 softmax over the dequantised values, rows of unequal length
    included."""
    gen = torch.Generator().manual_seed(3)
    lens = [300, 280, 261, 257]
    D, C = len(lens), max(lens)
    nb = -(-C // BS)
    cache = KVCache(1, D * nb, BS, KVH, HD, torch.bfloat16, "int8", torch.device("cpu"),
                    kernel_layout=False)
    tables = torch.arange(D * nb, dtype=torch.int32).flip(0).view(D, nb)  # scrambled pages
    slots = [torch.tensor([int(tables[r, p // BS]) * BS + p % BS for p in range(n)])
             for r, n in enumerate(lens)]
    for r, n in enumerate(lens):  # all but the last token of each row: earlier steps
        kv = torch.randn(n, 2, KVH, HD, generator=gen).bfloat16()
        cache.write(0, slots[r][:-1], kv[:-1, 0], kv[:-1, 1])
        slots[r] = (slots[r], kv[-1])
    q = torch.randn(D, KVH * GROUP, HD, generator=gen).bfloat16()
    attn = Attention(KVH * GROUP, KVH, HD, "sdpa", cache)

    def step(threshold: int) -> tuple[torch.Tensor, torch.dtype, torch.Tensor | None]:
        monkeypatch.setattr(attention_module, "F32_DECODE_MIN_TOKENS", threshold)
        meta = attn.prepare(AttentionMetadata(
            slot_mapping=torch.stack([s[-1] for s, _ in slots]), block_tables=tables,
            context_lens=torch.tensor(lens, dtype=torch.int32),
            query_start_loc=torch.arange(D + 1, dtype=torch.int32), num_decode=D,
            max_decode_context=C, min_decode_context=min(lens)))
        _, mask, attend = meta.extra["decode"]
        last = torch.stack([kv for _, kv in slots])  # [D, 2, kvh, hd]
        return attn.forward(0, q, last[:, 0], last[:, 1], meta), attend, mask

    assert D * C >= attention_module.F32_DECODE_MIN_TOKENS == 1024
    f32, attend32, mask32 = step(1024)
    b16, attend16, mask16 = step(D * C + 1)
    assert (attend32, mask32.dtype, attend16, mask16.dtype) == (
        torch.float32, torch.float32, torch.bfloat16, torch.bfloat16)
    assert f32.dtype == b16.dtype == torch.bfloat16
    want = torch.cat([_reference(q[r:r + 1].float(),
                                 *cache.gather(0, s, torch.float32).unbind(1), n - 1)
                      for r, ((s, _), n) in enumerate(zip(slots, lens))])
    err32, err16 = ((x.float() - want).abs().max().item() for x in (f32, b16))
    assert err32 <= err16 and err32 < 1e-2
