"""Unit tests of the engine's parts: block manager, config, NVTX helper, kernel probe."""
from __future__ import annotations

import contextlib

import pytest
import torch

from backend.engine.block_manager import BlockManager
from backend.engine.config import EngineConfig
from backend.engine.kernels import probe_attention_kernel
from backend.engine.nvtx import NvtxRanges
from backend.engine.sampling import SamplingParams
from backend.engine.sequence import Sequence


def _seq(tokens: list[int]) -> Sequence:
    return Sequence("s", list(tokens), len(tokens), SamplingParams())


def test_block_manager_prefix_sharing_and_ref_counts() -> None:
    bm = BlockManager(num_blocks=8, block_size=4, enable_prefix_caching=True)
    a = _seq(list(range(10)))  # 3 blocks
    assert bm.allocate(a) == 0 and bm.num_free == 5
    a.num_computed = 10
    bm.register_computed(a)  # 2 full blocks registered
    b = _seq(list(range(8)) + [99, 98, 97])
    assert bm.allocate(b) == 8  # both full blocks shared
    assert b.block_table[:2] == a.block_table[:2] and bm.num_free == 4
    assert bm.blocks[a.block_table[0]].ref_count == 2
    bm.free_seq(a)
    assert bm.num_free == 5  # shared blocks still held by b
    bm.free_seq(b)
    assert bm.num_free == 8
    # freed but still cached: a third request revives them
    c = _seq(list(range(9)))
    assert bm.allocate(c) == 8 and bm.num_free == 5
    bm.free_seq(c)


def test_prefix_hit_never_covers_the_last_token() -> None:
    bm = BlockManager(num_blocks=8, block_size=4, enable_prefix_caching=True)
    a = _seq(list(range(8)))
    bm.allocate(a)
    a.num_computed = 8
    bm.register_computed(a)
    b = _seq(list(range(8)))  # same 8 tokens: only the first block may be a hit
    assert bm.allocate(b) == 4
    bm.free_seq(a)
    bm.free_seq(b)


def test_reused_block_loses_its_hash() -> None:
    bm = BlockManager(num_blocks=2, block_size=4, enable_prefix_caching=True)
    a = _seq(list(range(5)))
    bm.allocate(a)
    a.num_computed = 5
    bm.register_computed(a)
    bm.free_seq(a)
    b = _seq([50, 51, 52, 53, 54, 55, 56])  # takes both blocks, overwriting the cached one
    assert bm.allocate(b) == 0
    bm.free_seq(b)
    assert bm.allocate(_seq(list(range(5)))) == 0  # no stale hit


def test_prefix_caching_off_never_shares() -> None:
    bm = BlockManager(num_blocks=8, block_size=4, enable_prefix_caching=False)
    a = _seq(list(range(9)))
    bm.allocate(a)
    a.num_computed = 9
    bm.register_computed(a)
    assert bm.allocate(_seq(list(range(9)))) == 0


def test_engine_config_rejects_unknown_and_bad_values() -> None:
    with pytest.raises(ValueError, match="kv_dtype"):
        EngineConfig.from_dict({"kv_dtype": "int8"})
    with pytest.raises(ValueError, match="scheduling"):
        EngineConfig(scheduling="greedy")
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        EngineConfig(kv_cache_dtype="int4")
    with pytest.raises(ValueError, match="block_size"):
        EngineConfig(block_size=0)
    assert EngineConfig.from_dict({"attention": "math"}).attention == "math"


def test_nvtx_off_is_a_shared_noop_and_on_works() -> None:
    off = NvtxRanges(enabled=False)
    assert off.range("decode") is off.range("prefill")
    assert isinstance(off.range("x"), contextlib.nullcontext)
    on = NvtxRanges(enabled=True, prefix="infer")
    with on.range("tokenize"):
        pass


def test_attention_kernel_probe_names_the_kernel() -> None:
    name, ctx = probe_attention_kernel("sdpa", torch.device("cpu"), torch.float32, 2, 2, 16)
    assert name.startswith("cpu_") and "unknown" not in name and ctx is None
    assert probe_attention_kernel("math", torch.device("cpu"), torch.float32, 2, 2, 16) == \
        ("math", None)


def test_the_blocks_free_check_catches_a_leak(make_engine) -> None:
    from tests.backend.tiny_models import assert_all_blocks_free

    engine = make_engine()
    # ignore_eos: a sampled EOS would end the request in its first step and free its blocks
    engine.add_request("leak", list(range(3, 40)), SamplingParams(max_tokens=4, ignore_eos=True))
    engine.step()
    assert engine.has_unfinished()
    with pytest.raises(AssertionError):
        assert_all_blocks_free([engine])
    engine.abort_request("leak")
    assert_all_blocks_free([engine])
