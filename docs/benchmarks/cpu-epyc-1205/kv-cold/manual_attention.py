"""Ad hoc: one decode query's attention (SmolLM2's 9 heads on 3 KV heads) after the gather:
SDPA against matmul + softmax in bf16 and in fp32, warm caches; then SDPA on 1 and 2 threads."""
import torch
import torch.nn.functional as F
from timing import bench
torch.manual_seed(0)
for C in (64, 128, 270, 600):
    data = torch.randn(2000, 2, 3, 64, dtype=torch.bfloat16)
    idx = torch.randperm(2000)[:C].sort().values.view(1, C)
    q = torch.randn(1, 9, 64, dtype=torch.bfloat16)
    scale = 0.125
    def gather():
        return data.index_select(0, idx.view(-1)).view(1, C, 2, 3, 64)
    def sdpa():
        kv = gather(); k = kv[:, :, 0].transpose(1, 2); v = kv[:, :, 1].transpose(1, 2)
        return F.scaled_dot_product_attention(q.view(1, 3, 3, 64), k, v, scale=scale)
    def manual():
        kv = gather(); k = kv[:, :, 0].transpose(1, 2); v = kv[:, :, 1].transpose(1, 2)
        s = torch.matmul(q.view(1, 3, 3, 64), k.transpose(-1, -2)).float() * scale
        p = torch.softmax(s, -1).to(q.dtype)
        return torch.matmul(p, v)
    def manual32():
        kv = gather(); k = kv[:, :, 0].transpose(1, 2); v = kv[:, :, 1].transpose(1, 2)
        s = torch.matmul(q.view(1, 3, 3, 64).float(), k.transpose(-1, -2).float()) * scale
        p = torch.softmax(s, -1)
        return torch.matmul(p, v.float()).to(q.dtype)
    a, b, c = sdpa(), manual(), manual32()
    print(C, "gather %.1f sdpa %.1f manual %.1f manual-fp32 %.1f us" % (bench(gather), bench(sdpa), bench(manual), bench(manual32)),
          "err", (a.float()-b.float()).abs().max().item(), (a.float()-c.float()).abs().max().item())
print("threads", torch.get_num_threads())
for C in (128, 270, 600):
    data = torch.randn(2000, 2, 3, 64, dtype=torch.bfloat16)
    idx = torch.randperm(2000)[:C].sort().values.view(1, C)
    q = torch.randn(1, 9, 64, dtype=torch.bfloat16)
    def sdpa():
        kv = data.index_select(0, idx.view(-1)).view(1, C, 2, 3, 64); k = kv[:, :, 0].transpose(1, 2); v = kv[:, :, 1].transpose(1, 2)
        return F.scaled_dot_product_attention(q.view(1, 3, 3, 64), k, v, scale=0.125)
    def sdpa_contig():
        kv = data.index_select(0, idx.view(-1)).view(1, C, 2, 3, 64).permute(2, 0, 3, 1, 4).contiguous()
        return F.scaled_dot_product_attention(q.view(1, 3, 3, 64), kv[0], kv[1], scale=0.125)
    r2 = (bench(sdpa), bench(sdpa_contig))
    torch.set_num_threads(1)
    r1 = (bench(sdpa), bench(sdpa_contig))
    torch.set_num_threads(2)
    print(C, "2 threads sdpa %.1f contig %.1f | 1 thread sdpa %.1f contig %.1f" % (*r2, *r1))
