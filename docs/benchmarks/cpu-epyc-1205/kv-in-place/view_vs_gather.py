# SDPA of one decode query (SmolLM2 heads) against a context gathered through slot indices
# (g) or read as a view of consecutive slots (v), 30 layers of cache, 100 x 30 calls each.
# Output: view-vs-gather.txt.
import torch, time, torch.nn.functional as F
torch.manual_seed(0)
data = torch.randn(30, 1024, 2, 3, 64, dtype=torch.bfloat16)
q = torch.randn(1, 3, 3, 64, dtype=torch.bfloat16)
IDX = {}
def g(C, l):
    idx = IDX[C]
    kv = data[l].index_select(0, idx.reshape(-1)).view(1, C, 2, 3, 64)
    return F.scaled_dot_product_attention(q, kv[:, :, 0].transpose(1, 2), kv[:, :, 1].transpose(1, 2))
def v(C, l):
    kv = data[l, 100:100 + C].unsqueeze(0)
    return F.scaled_dot_product_attention(q, kv[:, :, 0].transpose(1, 2), kv[:, :, 1].transpose(1, 2))
for C in (64, 128, 330, 700):
    IDX[C] = torch.arange(100, 100 + C).view(1, C)
    assert torch.equal(g(C, 0), v(C, 0))
    for fn in (g, v, g, v):
        t = time.perf_counter()
        for _ in range(100):
            for l in range(30): fn(C, l)
        print(C, fn.__name__, round((time.perf_counter() - t) / 3000 * 1e6, 1), "us")
