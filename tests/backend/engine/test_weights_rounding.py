"""The rounding schemes weights_rounding compares: each stays within its step of the
weights, and finer scale layouts round more finely than one scale per row."""
from __future__ import annotations

import torch

from backend.engine.weights_rounding import (LAYER_KINDS, int8_group, int8_row, int8_row_asym,
                                             int8_row_mse, schemes)
from backend.layers.quantize import quantize_int8


def test_schemes_error_bounds():
    w = torch.randn(64, 576, generator=torch.Generator().manual_seed(0))
    w[:, 7] *= 20  # an outlier column, as real weights have
    q, s = quantize_int8(w)
    torch.testing.assert_close(int8_row(w), q.float() * s[:, None])
    row_err = (int8_row(w) - w).abs()
    assert (row_err <= s[:, None] / 2 + 1e-6).all()
    assert ((int8_row_mse(w) - w) ** 2).sum() <= (row_err ** 2).sum() + 1e-6
    lo, hi = w.amin(1, keepdim=True), w.amax(1, keepdim=True)
    assert ((int8_row_asym(w) - w).abs() <= (hi - lo) / 510 + 1e-6).all()
    g32 = (int8_group(w, 32) - w).abs()
    assert g32.mean() < row_err.mean() / 2
    names = schemes()
    assert names["int8 per row, qkv only"][1] == ("qkv",)
    assert names["int8 per row (today)"][1] == LAYER_KINDS
