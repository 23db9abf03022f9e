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
