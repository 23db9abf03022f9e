"""EngineConfig, ServerConfig, SamplingParams, TokenizerMeta: frozen pydantic models; a bad
value or an unknown key is named by its dotted path; today's configs still build."""
from __future__ import annotations

import json

import pydantic
import pytest

from backend.cli import build_parser, config_from_args
from backend.engine.config import EngineConfig
from backend.engine.sampling import SamplingParams
from backend.schema import describe
from backend.server.config import ServerConfig
from backend.tokenizer import TokenizerMeta


def _error(data: dict) -> str:
    with pytest.raises(pydantic.ValidationError) as err:
        ServerConfig.from_dict(data)
    return describe(err.value)


@pytest.mark.parametrize("data,expected", [
    ({"port": 70000}, "port: Input should be less than or equal to 65535"),
    ({"body_timeout_s": 0}, "body_timeout_s: Input should be greater than 0"),
    ({"max_connections": 0}, "max_connections: Input should be greater than or equal to 1"),
    ({"default_completion_max_tokens": 0}, "default_completion_max_tokens: "),
    ({"modle": "x"}, "unknown key 'modle'"),
    ({"engine": {"kv_cache_gib": 1}}, "unknown key 'engine.kv_cache_gib'"),
    ({"engine": {"block_size": 0}}, "engine.block_size: Input should be greater than or equal"),
    ({"engine": {"max_num_seqs": "many"}}, "engine.max_num_seqs: Input should be a valid int"),
    ({"engine": {"kv_cache_memory_gib": -1}}, "engine.kv_cache_memory_gib: "),
    ({"engine": {"max_model_len": 0}}, "engine.max_model_len: "),
    ({"engine": {"scheduling": "greedy"}},
     "engine.scheduling: scheduling must be one of continuous, static; got 'greedy'"),
    ({"engine": {"int4_group_size": 48}}, "engine.int4_group_size: int4_group_size must be one"),
])
def test_a_bad_value_names_its_dotted_path(data, expected):
    assert expected in _error(data)


def test_todays_configs_still_build():
    default = ServerConfig()
    assert (default.port, default.engine.block_size, default.engine.scheduling) == (
        8000, 16, "continuous")
    built = ServerConfig.from_dict({"model": "synthetic:tiny", "port": 0, "engine": {
        "device": "cpu", "dtype": "float32", "max_num_seqs": 8, "attention": "math",
        "kv_cache_dtype": "int8", "weights_dtype": "int4", "int4_group_size": 64,
        "lm_head_dtype": "int8", "kv_cache_memory_gib": 0.25, "max_model_len": 128}})
    assert built.engine == EngineConfig(device="cpu", dtype="float32", max_num_seqs=8,
                                        attention="math", kv_cache_dtype="int8",
                                        weights_dtype="int4", int4_group_size=64,
                                        lm_head_dtype="int8", kv_cache_memory_gib=0.25,
                                        max_model_len=128)
    cli = config_from_args(build_parser().parse_args(["--port", "0", "--block-size", "32"]))
    assert (cli.port, cli.engine.block_size) == (0, 32)


def test_configs_are_frozen_and_copied_with_model_copy():
    config = ServerConfig()
    with pytest.raises(pydantic.ValidationError):
        config.port = 1  # type: ignore[misc]
    copy = config.model_copy(update={"engine": config.engine.model_copy(
        update={"max_num_seqs": 4})})
    assert copy.engine.max_num_seqs == 4 and config.engine.max_num_seqs == 64
    assert hash(config.engine) == hash(EngineConfig())  # usable as a key


@pytest.mark.parametrize("cls,data,expected", [
    (SamplingParams, {"top_p": 1.5}, "top_p: Input should be less than or equal to 1"),
    (SamplingParams, {"stop_token_ids": [1, "x"]}, "stop_token_ids.1: Input should be a valid"),
    (SamplingParams, {"best_of": 2}, "unknown key 'best_of'"),
    (TokenizerMeta, {"eos_token_ids": [2], "special_tokens": {"bos_token": 1}},
     "special_tokens.bos_token: Input should be a valid string"),
    (TokenizerMeta, {}, "eos_token_ids: Field required"),
])
def test_engine_side_schemas_name_the_dotted_path(cls, data, expected):
    with pytest.raises(pydantic.ValidationError) as err:
        cls.from_dict(data)
    assert expected in describe(err.value)


def test_engine_side_schemas_round_trip():
    assert SamplingParams.from_dict({"stop_token_ids": [5, 6]}).stop_token_ids == (5, 6)
    meta = TokenizerMeta(eos_token_ids=(2, 3), bos_token_id=1, chat_template="t",
                         special_tokens={"bos_token": "<s>", "pad_token": None})
    assert TokenizerMeta.from_dict(json.loads(json.dumps(meta.to_dict()))) == meta
