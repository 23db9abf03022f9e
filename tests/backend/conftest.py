"""Backend-wide fixtures. Without a GPU, Triton kernels run under its interpreter: set
before any test module imports them (the choice is made when a kernel is defined)."""
from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(scope="session")
def smollm2_source():
    """The embedded SmolLM2-135M-Instruct (GGUF converted once, then cached)."""
    from backend.weights.loader import load_model_source

    return load_model_source("smollm2-135m-instruct")
