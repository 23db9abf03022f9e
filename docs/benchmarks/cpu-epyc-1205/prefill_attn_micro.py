# One SmolLM2 layer's prefill attention (9 heads, 3 KV heads, hd 64, bf16) on the CPU: one SDPA call
# with the causal mask against GQA/is_causal variants, then query tiles of 64/128/256 positions.
# Output: prefill-attn-micro.log.
import torch, time, statistics, torch.nn.functional as F
from backend.layers.attention import causal_chunk_mask
torch.manual_seed(0)
def bench(f, n=15):
    f(); ts=[]
    for _ in range(n):
        t=time.perf_counter(); f(); ts.append((time.perf_counter()-t)*1e3)
    return round(statistics.median(ts),2)
for n in (128, 512, 1024):
    q=torch.randn(n,9,64,dtype=torch.bfloat16); k=torch.randn(n,3,64,dtype=torch.bfloat16); v=torch.randn(n,3,64,dtype=torch.bfloat16)
    s=0.125
    mask=causal_chunk_mask(0,n,3,torch.device("cpu"),torch.bfloat16)
    kk=k.transpose(0,1).unsqueeze(0); vv=v.transpose(0,1).unsqueeze(0)
    def cur():
        qg=q.view(n,3,3,64).permute(1,2,0,3).reshape(1,3,3*n,64)
        o=F.scaled_dot_product_attention(qg,kk,vv,attn_mask=mask,scale=s)
        return o.view(3,3,n,64).permute(2,0,1,3).reshape(n,9,64)
    def gqa():
        o=F.scaled_dot_product_attention(q.transpose(0,1).unsqueeze(0),kk,vv,is_causal=True,scale=s,enable_gqa=True)
        return o[0].transpose(0,1)
    def expand():
        ke=kk.repeat_interleave(3,1); ve=vv.repeat_interleave(3,1)
        o=F.scaled_dot_product_attention(q.transpose(0,1).unsqueeze(0),ke,ve,is_causal=True,scale=s)
        return o[0].transpose(0,1)
    def grouped_causal():
        # per group member: 3 calls of [1,3,n,64] with is_causal
        qg=q.view(n,3,3,64)
        outs=[F.scaled_dot_product_attention(qg[:,:,j].transpose(0,1).unsqueeze(0),kk,vv,is_causal=True,scale=s) for j in range(3)]
        return torch.stack([o[0].transpose(0,1) for o in outs],2).reshape(n,9,64)
    a=cur()
    print(n,"current",bench(cur),"gqa causal",bench(gqa),"expand causal",bench(expand),"grouped causal", bench(grouped_causal))
    for f in (gqa,expand,grouped_causal):
        print("   ", f.__name__, (f().float()-a.float()).abs().max().item(), torch.equal(f(),a))
print("---- split")
for n in (128, 256, 512, 1024):
    q=torch.randn(n,9,64,dtype=torch.bfloat16); k=torch.randn(n,3,64,dtype=torch.bfloat16); v=torch.randn(n,3,64,dtype=torch.bfloat16)
    s=0.125
    mask=causal_chunk_mask(0,n,3,torch.device("cpu"),torch.bfloat16)
    kk=k.transpose(0,1).unsqueeze(0); vv=v.transpose(0,1).unsqueeze(0)
    def run(q, start, ctx, m):
        nq=q.shape[0]
        qg=q.view(nq,3,3,64).permute(1,2,0,3).reshape(1,3,3*nq,64)
        o=F.scaled_dot_product_attention(qg,kk[:,:,:ctx],vv[:,:,:ctx],attn_mask=m,scale=s)
        return o.view(3,3,nq,64).permute(2,0,1,3).reshape(nq,9,64)
    a=run(q,0,n,mask)
    for S in (64,128,256):
        if S>=n: continue
        masks=[causal_chunk_mask(i0,min(S,n-i0),3,torch.device("cpu"),torch.bfloat16) for i0 in range(0,n,S)]
        def split():
            return torch.cat([run(q[i0:i0+S],i0,min(i0+S,n),masks[j]) for j,i0 in enumerate(range(0,n,S))],0)
        b=split()
        print(n,S,"full",bench(lambda: run(q,0,n,mask)),"split",bench(split), "maxdiff", (b.float()-a.float()).abs().max().item(), torch.equal(a,b))
