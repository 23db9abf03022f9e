"""Fixtures: the backend app over the fake engine (fast) and over the real engine."""
from __future__ import annotations

import dataclasses
import functools

import openai
import pytest

from backend.engine.config import EngineConfig
from backend.layers import cpu_dequant
from backend.server import ServerConfig, create_app
from backend.tokenizer import Tokenizer

from .fakes import fake_factory
from .harness import ServerThread


@functools.lru_cache(maxsize=None)
def _tiny_source(chat_template: bool = True) -> object:
    from backend.weights.loader import synthetic_source

    source = synthetic_source("tiny")
    if not chat_template:
        tok = source.tokenizer
        source = dataclasses.replace(source, name="tiny-no-template", tokenizer=Tokenizer(
            tok.backend, tok.meta.model_copy(update={"chat_template": None})))
    return source


def fake_server(chat_template: bool = True, nvtx: bool = False,
                **engine_kwargs: object) -> ServerThread:
    factory = fake_factory(**engine_kwargs)
    config = ServerConfig(model="synthetic:tiny", served_model_name="fake-model",
                          engine=EngineConfig(max_num_seqs=8, nvtx=nvtx, nvtx_prefix="t"))
    loader = lambda name: _tiny_source(chat_template)  # noqa: E731
    return ServerThread(lambda: create_app(config, source_loader=loader,
                                           engine_factory=factory)).start()


@pytest.fixture(scope="module")
def fake() -> ServerThread:
    server = fake_server()
    yield server
    server.stop()


def copy_kernel(dtype: str) -> str:
    """The ``prefill_kernel`` /health reports for kept dense copies in ``dtype``: bf16 copies
    are reordered for oneDNN where this CPU runs that."""
    return "dense-copy+onednn" if dtype == "bfloat16" and cpu_dequant.onednn_bf16() \
        else "dense-copy+F.linear"


def real_server(model: str, **engine: object) -> ServerThread:
    """The app over the real AsyncEngine and model loader."""
    config = ServerConfig(model=model, engine=EngineConfig(**engine))
    return ServerThread(lambda: create_app(config)).start()


@pytest.fixture(scope="session")  # shared by the SDK and the gateway tests: load it once
def smollm2() -> ServerThread:
    # A smaller KV pool than the default keeps the test process light; 2048 tokens of context
    # is plenty for these prompts.
    server = real_server("smollm2-135m-instruct", kv_cache_memory_gib=0.25, max_model_len=2048)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def tiny() -> ServerThread:
    server = real_server("synthetic:tiny", max_model_len=512)
    yield server
    server.stop()


@pytest.fixture
async def sdk_client():
    """Makes AsyncOpenAI clients (base URL, keyword overrides) and closes them while the
    test's event loop still runs: a client left to the garbage collector closes on a dead
    loop, and asyncio logs that error into whichever test runs then."""
    clients: list[openai.AsyncOpenAI] = []

    def make(base_url: str, **kwargs: object) -> openai.AsyncOpenAI:
        clients.append(openai.AsyncOpenAI(**{"base_url": base_url, "api_key": "unused",
                                             "max_retries": 0, **kwargs}))
        return clients[-1]

    yield make
    for client in clients:
        await client.close()
