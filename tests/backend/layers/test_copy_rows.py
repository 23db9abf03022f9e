"""From how many rows CUDA layers use their dense copies (``backend.layers.copy_rows``): the
crossover rule, the measurement's orchestration over real layers with an injected timer (the
path each layer was set to and the rows it was called with decide the time), the fixed
setting, and on CUDA the real timer and the path each layer then takes."""
from __future__ import annotations

import pytest
import torch

from backend.layers.copy_rows import CANDIDATE_ROWS, NEVER, choose, crossover, shape_key
from backend.layers.fused_ops import EAGER, TRITON
from backend.layers.gemv import Prologue
from backend.layers.linear import (GPU_COPY_MIN_ROWS, DenseLinear, LinearRows, WeightFormat,
                                   make_linear, matmul)


# int4 layers keep a dense copy on the CPU only where torch's packed row block divides
# their outputs: 64 rows where its int4 kernel uses AVX-512, 32 elsewhere
INT4_N = 128


def _layer(kind: str, n: int, k: int, seed: int, device: str = "cpu"):
    gen = torch.Generator().manual_seed(seed)
    layer = make_linear(WeightFormat(kind, None, 32), n, k, False, torch.device(device),
                        torch.bfloat16 if device == "cuda" else torch.float32)
    LinearRows(layer).load(torch.randn(n, k, generator=gen) * 0.05)
    return layer


def test_the_crossover_is_where_the_copy_wins_from_then_on():
    # (codes, copy) µs a layer by rows
    assert crossover({16: (10, 12), 32: (10, 11), 64: (10, 9), 128: (10, 5)}) == 64
    assert crossover({16: (10, 9), 32: (10, 9), 64: (10, 9)}) == 16
    # a win below a loss does not count: the copy must win at every larger count
    assert crossover({16: (10, 9), 32: (10, 11), 64: (10, 9)}) == 64
    # lost at the largest: only past the codes' kernels
    assert crossover({16: (10, 9), 64: (10, 11)}) == NEVER
    # within the margin counts as a loss
    assert crossover({64: (10, 9.9)}) == NEVER
    assert crossover({64: (10, 9.7)}) == 64


def test_measured_rows_are_set_per_shape_from_what_each_path_took():
    qkv = [_layer("int4", INT4_N, 64, seed=s) for s in range(3)]
    down = [_layer("int8", 64, 96, seed=10 + s) for s in range(2)]
    bare = _layer("int4", INT4_N, 64, seed=20)  # keeps no copy: not timed, not set
    for m in qkv + down:
        m.keep_prefill_dense(True)
    calls: list[tuple[str, int, str]] = []
    for m in qkv + down + [bare]:
        # record each call: the layer's shape, its rows, and the path it was set to
        m.forward = (lambda layer: lambda x: calls.append(
            (shape_key(layer), x.shape[0],
             "copy" if layer.gpu_copy_min_rows <= x.shape[0] else "codes")))(m)
    # int4: the copy wins from 48 rows; int8: it never wins
    cost = {shape_key(qkv[0]): lambda path, rows: 10.0 if path == "codes" or rows < 48 else 8.0,
            shape_key(down[0]): lambda path, rows: 10.0 if path == "codes" else 11.0}

    def timer(fn):
        calls.clear()
        fn()
        (key, rows, path), = set(calls)  # one shape, one row count, one path a timing
        assert len(calls) == (3 if key == shape_key(qkv[0]) else 2)  # every layer of it
        return cost[key](path, rows) * len(calls) * 1e-6

    keys = {shape_key(qkv[0]), shape_key(down[0])}
    assert len(keys) == 2
    chosen = choose(qkv + down + [bare], "auto", EAGER, timer=timer, reps=3)
    assert chosen.mode == "measured" and set(chosen.rows) == keys
    assert chosen.rows[shape_key(qkv[0])] == 48 and chosen.rows[shape_key(down[0])] == NEVER
    assert [m.gpu_copy_min_rows for m in qkv] == [48] * 3
    assert [m.gpu_copy_min_rows for m in down] == [NEVER] * 2
    assert bare.gpu_copy_min_rows == GPU_COPY_MIN_ROWS["int4"]
    # µs a layer, both paths, at every row count timed
    us = chosen.us[shape_key(qkv[0])]
    assert sorted(us) == list(CANDIDATE_ROWS)
    assert us[16] == (10.0, 10.0) and us[64] == (10.0, 8.0)
    assert chosen.as_dict()["rows"] == chosen.rows


def test_a_set_row_count_or_the_default_applies_untimed():
    layers = [_layer("int4", INT4_N, 64, seed=s) for s in range(2)]
    assert choose(layers, "auto", EAGER, timer=None).mode == "none"  # no copies: nothing timed
    for m in layers:
        m.keep_prefill_dense(True)
    chosen = choose(layers, None, EAGER, timer=None)  # the default: the fixed crossover
    assert (chosen.mode, chosen.us) == ("fixed", {})
    assert chosen.rows == {shape_key(layers[0]): GPU_COPY_MIN_ROWS["int4"]}
    assert [m.gpu_copy_min_rows for m in layers] == [GPU_COPY_MIN_ROWS["int4"]] * 2
    chosen = choose(layers, 40, EAGER, timer=None)
    assert (chosen.mode, chosen.rows) == ("fixed", {shape_key(layers[0]): 40})
    assert [m.gpu_copy_min_rows for m in layers] == [40, 40]


def test_the_timer_key_distinguishes_kernels_and_shapes():
    a, b = _layer("int4", 96, 64, seed=1), _layer("int8", 96, 64, seed=2)
    c = _layer("int4", 64, 96, seed=3)
    assert len({shape_key(a), shape_key(b), shape_key(c)}) == 3
    assert shape_key(a) == shape_key(_layer("int4", 96, 64, seed=4))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_each_layer_takes_the_path_the_measurement_chose():
    layers = [_layer("int4", 4096, 4096, seed=s, device="cuda") for s in range(4)]
    for m in layers:
        m.keep_prefill_dense(True)
    chosen = choose(layers, "auto", TRITON, reps=3)
    first = chosen.rows[shape_key(layers[0])]
    assert first in (*CANDIDATE_ROWS, NEVER)
    assert all(t[0] > 0 and t[1] > 0 for t in chosen.us[shape_key(layers[0])].values())
    dense = DenseLinear.over(layers[0].prefill_weight)
    for rows in (16, 64, 128):
        x = torch.randn(rows, 4096, device="cuda", dtype=torch.bfloat16)
        on_copy = torch.equal(matmul(layers[0], x, Prologue(), TRITON)[0],
                              matmul(dense, x, Prologue(), TRITON)[0])
        assert on_copy == (rows >= first), rows
