"""The int8 K/V read and write paths of one layer alone, µs per call (SmolLM2 shapes: 3 KV
heads of 64): the tree before ("head": scales per head, gathered then permuted into a dense
copy; K and V quantised and written apart), scales per token ("slot", and the multiply
written into a bf16 output, "slot_out"), the bf16 cache's gather beside them. Reads of N
context tokens, writes of T tokens.

    python docs/benchmarks/cpu-epyc-1206/int8-kv-slot-scales/micro.py
"""
import time

import torch

torch.manual_seed(0)
KVH, HD, SLOTS = 3, 64, 20000


def timed(fn, n: int = 200) -> float:
    for _ in range(10):
        fn()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return round((time.perf_counter() - t0) / n * 1e6, 1)


data = torch.randint(-127, 128, (SLOTS, 2, KVH, HD), dtype=torch.int8)
sc_head = torch.rand(2, KVH, SLOTS)
sc_slot = sc_head.permute(2, 0, 1).contiguous()
bf = torch.randn(SLOTS, 2, KVH, HD).bfloat16()
for N in (560, 2400, 9600):
    idx = torch.randperm(SLOTS)[:N].sort().values

    def head():
        kv = data.index_select(0, idx)
        s = sc_head.index_select(2, idx).permute(2, 0, 1).contiguous()
        return kv.float().mul_(s.unsqueeze(-1)).to(torch.bfloat16)

    def slot():
        kv = data.index_select(0, idx)
        s = sc_slot.index_select(0, idx)
        return kv.float().mul_(s.unsqueeze(-1)).to(torch.bfloat16)

    def slot_out():
        kv = data.index_select(0, idx).float()
        s = sc_slot.index_select(0, idx)
        return torch.mul(kv, s.unsqueeze(-1), out=torch.empty(kv.shape, dtype=torch.bfloat16))

    assert torch.equal(head(), slot()) and torch.equal(head(), slot_out())
    print("read", N, {name: timed(f) for name, f in dict(
        head=head, slot=slot, slot_out=slot_out, bf16=lambda: bf.index_select(0, idx)).items()})
for T in (1, 4, 32):
    x = torch.randn(T, 2, KVH, HD).bfloat16()
    slots = torch.randperm(SLOTS)[:T]

    def write_head():
        for c in range(2):
            xf = x[:, c].float()
            scale = (xf.abs().amax(dim=-1) / 127).clamp_(min=1e-12)
            q = (xf / scale.unsqueeze(-1)).round_().clamp_(-127, 127).to(torch.int8)
            data[:, c].index_copy_(0, slots, q)
            sc_head[c].index_copy_(1, slots, scale.t())

    def write_slot():
        xf = torch.stack((x[:, 0], x[:, 1]), 1).float()
        scale = (xf.abs().amax(dim=-1) / 127).clamp_(min=1e-12)
        q = (xf / scale.unsqueeze(-1)).round_().clamp_(-127, 127).to(torch.int8)
        data.index_copy_(0, slots, q)
        sc_slot.index_copy_(0, slots, scale)

    print("write", T, {"head": timed(write_head), "slot": timed(write_slot)})
