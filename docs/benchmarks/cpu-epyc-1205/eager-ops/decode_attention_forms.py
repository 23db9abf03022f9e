"""SmolLM2's decode attention on the CPU timed alone (9 query heads, 3 KV heads, head_dim 64,
bf16), per form, µs a call (one layer), at D sequences and C-token contexts: the engine's
form (index_select from the cache, then SDPA with the 3 query heads of a KV head folded into
the query axis: "gather+sdpa") against float32 SDPA, a permuted contiguous copy, SDPA with
enable_gqa over 9 query heads, and explicit float32 matmuls + softmax.

    python docs/benchmarks/cpu-epyc-1205/eager-ops/decode_attention_forms.py
"""
import torch
import torch.nn.functional as F
from torch.utils.benchmark import Timer

KVH, G, HD = 3, 3, 64
SCALE = HD ** -0.5


def bench(f):
    """µs a call: the median of torch's own timer's blocks."""
    return Timer("f()", globals={"f": f}).blocked_autorange(min_run_time=0.5).median * 1e6


def forms(cache, idx, q, D, C):
    def gathered():
        kv = cache.index_select(0, idx.view(-1)).view(D, C, 2, KVH, HD)
        return kv[:, :, 0].transpose(1, 2), kv[:, :, 1].transpose(1, 2)  # [D, kvh, C, hd]

    def engine():
        k, v = gathered()
        return F.scaled_dot_product_attention(q.view(D, KVH, G, HD), k, v, scale=SCALE)

    def float32():
        k, v = gathered()
        return F.scaled_dot_product_attention(q.view(D, KVH, G, HD).float(), k.float(),
                                              v.float(), scale=SCALE).to(q.dtype)

    def permuted():
        kv = cache.index_select(0, idx.view(-1)).view(D, C, 2, KVH, HD)
        kv = kv.permute(0, 2, 3, 1, 4).contiguous()  # [D, 2, kvh, C, hd]
        return F.scaled_dot_product_attention(q.view(D, KVH, G, HD), kv[:, 0], kv[:, 1],
                                              scale=SCALE)

    def gqa():
        k, v = gathered()
        o = F.scaled_dot_product_attention(q.view(D, KVH * G, 1, HD), k, v, scale=SCALE,
                                           enable_gqa=True)
        return o.view(D, KVH, G, HD)

    def matmuls():
        k, v = gathered()
        s = torch.matmul(q.view(D, KVH, G, HD).float(), k.float().transpose(-1, -2)) * SCALE
        return torch.matmul(torch.softmax(s, -1), v.float()).to(q.dtype)

    return {"gather+sdpa": engine, "float32 sdpa": float32, "permuted copy": permuted,
            "enable_gqa": gqa, "float32 matmuls": matmuls}


def main():
    torch.manual_seed(0)
    cache = torch.randn(16384, 2, KVH, HD, dtype=torch.bfloat16)
    print("D C " + " | ".join(forms(cache, torch.zeros(1, 1, dtype=torch.long),
                                    torch.zeros(1, 9, 64), 1, 1)))
    for D in (1, 8):
        for C in (64, 160, 512):
            idx = torch.randperm(cache.shape[0])[:D * C].view(D, C)
            q = torch.randn(D, KVH * G, HD, dtype=torch.bfloat16)
            fs = forms(cache, idx, q, D, C)
            ref = fs["gather+sdpa"]()
            cells = []
            for name, f in fs.items():
                err = (f().float() - ref.float()).abs().max().item()
                cells.append(f"{bench(f):.1f} (max diff {err:.4f})")
            print(D, C, " | ".join(cells), flush=True)


if __name__ == "__main__":
    main()
