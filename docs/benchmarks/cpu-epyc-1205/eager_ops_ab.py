"""A/B in one process: the CPU engine with its defaults, with the step's eager ops as they
are ("now": the bf16 norm as one layer_norm over [x, -x], RoPE through one roll) or as in the
tree before ("before": torch's rms_norm, RoPE by cat((-x2, x1))), alternating round by
round. Decode step time at batch 1 / 8 / 32 (16-token prompts) and the time to the first
token of 100- and 512-token prompts.

    python docs/benchmarks/cpu-epyc-1205/eager_ops_ab.py [ROUNDS] > OUT.json
"""
import os
import sys

import torch
import torch.nn.functional as F

from backend.layers import fused_ops

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from copy_ab import alternate, decode_ms, finish, smollm2_engine  # noqa: E402
from onednn_ab import first_token_ms  # noqa: E402


def norm_before(x, residual, weight, eps):
    if residual is not None:
        x = x + residual
    return F.rms_norm(x, (x.shape[-1],), weight, eps), x


def rope_before(qk, cos, sin):
    half = qk.shape[-1] // 2
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    rotated = torch.cat((-qk[..., half:], qk[..., :half]), dim=-1)
    qk.copy_(qk * cos + rotated * sin)


VARIANTS = {"before": (norm_before, rope_before),
            "now": (fused_ops.EAGER.add_rms_norm, fused_ops.EAGER.rope_)}


def use(ops) -> None:
    object.__setattr__(fused_ops.EAGER, "add_rms_norm", ops[0])
    object.__setattr__(fused_ops.EAGER, "rope_", ops[1])


def main():
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    eng, out = smollm2_engine()
    out["samples"] = {}
    decode_ms(eng, 8, 4)  # warm-up
    alternate(eng, out, ("before", "now"), lambda name: use(VARIANTS[name]), rounds,
              first_token=first_token_ms)
    finish(out)


if __name__ == "__main__":
    main()
