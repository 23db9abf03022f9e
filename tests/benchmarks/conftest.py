"""The benchmarks' tests use the load tests' loopback servers (fake upstream, gateway); the
ablation's fused rows run Triton kernels, under the interpreter without a GPU (as the
backend's tests do: set before any module defines a kernel)."""
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from tests.loadtests.conftest import ROOT, lt_fake, lt_gateway  # noqa: E402,F401 (fixtures)
