"""Engine test fixtures: tiny reference models, an engine factory that checks after every
test that all KV blocks are free again."""
from __future__ import annotations

import pytest

from backend.engine.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from tests.backend.tiny_models import assert_all_blocks_free, source_from_hf, \
    tiny_hf_model, track_engines


@pytest.fixture(autouse=True)
def all_kv_blocks_free_after_each_test(monkeypatch):
    """Every engine a test builds (directly or inside AsyncEngine) must end with all its KV
    blocks free and no request left."""
    engines = track_engines(monkeypatch)
    yield
    assert_all_blocks_free(engines)


@pytest.fixture(scope="session")
def tiny_llama():
    return tiny_hf_model("llama")


@pytest.fixture(scope="session")
def tiny_source(tiny_llama):
    return source_from_hf(tiny_llama)


@pytest.fixture
def make_engine(tiny_source):
    """make_engine(**EngineConfig fields) -> LLMEngine on the tiny Llama (or source=...)."""
    def make(source=None, **overrides) -> LLMEngine:
        fields = dict(kv_cache_memory_gib=0.005, max_model_len=512, dtype="float32")
        fields.update(overrides)
        return LLMEngine(EngineConfig(**fields), source or tiny_source)

    return make
