"""Backend-wide fixtures."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def smollm2_source():
    """The embedded SmolLM2-135M-Instruct (GGUF converted once, then cached)."""
    from backend.weights.loader import load_model_source

    return load_model_source("smollm2-135m-instruct")
