"""weights_quality's variant names: each part maps to its engine flag."""
from __future__ import annotations

from backend.engine.weights_quality import variant_config


def test_variant_names_map_to_the_engine_flags():
    c = variant_config("int4:64+head/none@int8", "bfloat16")
    assert (c.weights_dtype, c.int4_group_size, c.lm_head_dtype, c.weights_scaling,
            c.cpu_int4_activations) == ("int4", 64, "int4", "none", "int8")
    c = variant_config("auto+head=int8@model", "float32")
    assert (c.weights_dtype, c.lm_head_dtype, c.cpu_int4_activations) == ("auto", "int8",
                                                                           "model")
    c = variant_config("auto", "bfloat16")
    assert (c.weights_scaling, c.cpu_int4_activations, c.lm_head_dtype) == (
        "activation", "int8x2", "model")


def test_a_model_with_a_short_context_limit_gets_its_own_limit():
    from backend.engine.weights_quality import build_engines
    from backend.weights.loader import load_model_source

    source = load_model_source("synthetic:tiny")  # max_position_embeddings 1024 < 2048
    engines, skipped = build_engines(source, ["bf16", "int4:48"], "float32")
    assert list(engines) == ["bf16"] and "int4:48" in skipped  # 48 does not divide 64
    assert engines["bf16"].max_model_len == source.config.max_position_embeddings == 1024


def test_the_kv_room_holds_one_whole_context():
    from backend.engine.weights_quality import kv_room_gib
    from backend.weights.loader import load_model_source

    big = load_model_source("synthetic:llama-2-7b").config  # 512 KiB of bf16 K/V a token
    assert kv_room_gib(big, 2048, "bfloat16") == (2048 // 16 + 1) * 16 * 2**19 / 2**30
    assert kv_room_gib(big, 2048, "float32") == 2 * kv_room_gib(big, 2048, "bfloat16")
    assert kv_room_gib(load_model_source("synthetic:tiny").config, 1024, "float32") == 0.25
