"""Ad hoc: one row through F.linear against torch.mv on this CPU, bf16 and float32, shapes
of SmolLM2 (the tied LM head 49152 x 576, its layers) and one 4096 x 4096; ms per call
(2 threads) and whether the outputs have the same bits (with a bias: mv + b)."""
import json, time
import torch
import torch.nn.functional as F
torch.set_num_threads(2)
torch.manual_seed(0)


def t(fn, n=30):
    for _ in range(3):
        fn()
    s = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - s) / n * 1e3


for dt in (torch.bfloat16, torch.float32):
    for N, K in ((49152, 576), (1728, 576), (576, 1536), (3072, 576), (576, 576), (4096, 4096)):
        W = (torch.randn(N, K) * 0.05).to(dt)
        x = torch.randn(1, K).to(dt)
        b = torch.randn(N).to(dt)
        print(json.dumps({"dtype": str(dt), "N": N, "K": K,
                          "linear_ms": round(t(lambda: F.linear(x, W)), 4),
                          "mv_ms": round(t(lambda: torch.mv(W, x[0])), 4),
                          "same_bits": torch.equal(F.linear(x, W)[0], torch.mv(W, x[0])),
                          "same_bits_with_bias": torch.equal(F.linear(x, W, b)[0],
                                                             torch.mv(W, x[0]) + b)}))

# batch invariance: each row of an 8-row F.linear against that row alone, both ways
W = (torch.randn(49152, 576) * 0.05).bfloat16()
X = torch.randn(8, 576).bfloat16()
full = F.linear(X, W)
print(json.dumps({"rows_of_8_equal_linear_1": all(torch.equal(F.linear(X[i:i + 1], W)[0], full[i])
                                                  for i in range(8)),
                  "rows_of_8_equal_mv": all(torch.equal(torch.mv(W, X[i]), full[i])
                                            for i in range(8))}))
