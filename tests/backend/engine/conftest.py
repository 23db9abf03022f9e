"""Engine test fixtures: tiny reference models, an engine factory that checks after every
test that all KV blocks are free again."""
from __future__ import annotations

import pytest

from backend.engine.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from tests.backend.tiny_models import source_from_hf, tiny_hf_model


@pytest.fixture(scope="session")
def tiny_llama():
    return tiny_hf_model("llama")


@pytest.fixture(scope="session")
def tiny_source(tiny_llama):
    return source_from_hf(tiny_llama)


@pytest.fixture
def make_engine(tiny_source):
    """make_engine(**EngineConfig fields) -> LLMEngine on the tiny Llama (or source=...)."""
    engines: list[LLMEngine] = []

    def make(source=None, **overrides) -> LLMEngine:
        fields = dict(kv_cache_memory_gib=0.005, max_model_len=512, dtype="float32")
        fields.update(overrides)
        engine = LLMEngine(EngineConfig(**fields), source or tiny_source)
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        assert not engine.has_unfinished(), "a test left requests in the engine"
        assert engine.block_manager.num_used == 0, "KV blocks still held after the test"
        assert engine.block_manager.num_free == engine.block_manager.num_blocks
