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
