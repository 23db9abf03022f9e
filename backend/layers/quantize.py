"""Weight-only quantisation math, independent of any kernel layout.

Three code forms, all "value = code * scale + offset":
  * int8, symmetric, one scale per output row: codes int8 [N, K], scale [N].
  * fp8 (e4m3), one scale per output row: codes float8_e4m3fn [N, K], scale [N]; the row's
    largest |w| maps to 448, e4m3's largest value.
  * int4, asymmetric, one (scale, min) pair per group of G inputs of a row: codes 0..15
    uint8 [N, K], scale/min [N, K / G]. This is GGUF's Q4_1 block exactly (G = 32); Q4_0 is
    the special case min = -8 * scale.

``GroupQuantized`` carries codes as they come out of a file (GGUF blocks), so a loader can
hand them over without a float copy of the model; the layers decide whether they keep the
codes as they are or re-quantise them into their own format.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

INT8_MAX = 127
INT4_LEVELS = 15
FP8_MAX = 448.0  # float8_e4m3fn's largest value
FP8_AMAX_FLOOR = 1e-12  # an all-zero row: any scale works, this one keeps 448 / amax finite


@dataclass
class GroupQuantized:
    """Group-wise codes of one [N, K] weight: value = codes * scale + min, per group of
    ``group_size`` consecutive inputs. ``bits`` 4: codes 0..15 (uint8); 8: codes int8."""
    codes: torch.Tensor  # [N, K] uint8 (bits 4) or int8 (bits 8)
    scale: torch.Tensor  # [N, K / group_size] float32
    min: torch.Tensor  # [N, K / group_size] float32 (zeros for symmetric formats)
    group_size: int
    bits: int

    @property
    def shape(self) -> torch.Size:
        return self.codes.shape

    def dequantize(self) -> torch.Tensor:
        """[N, K] float32 values."""
        N, K = self.codes.shape
        g = self.codes.view(N, K // self.group_size, self.group_size).float()
        return (g * self.scale.unsqueeze(-1) + self.min.unsqueeze(-1)).view(N, K)

    def rows(self, rows: slice) -> "GroupQuantized":
        return GroupQuantized(self.codes[rows], self.scale[rows], self.min[rows],
                              self.group_size, self.bits)


def quantize_int8(w: torch.Tensor, scale_dtype: torch.dtype = torch.float32
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """w [N, K] float -> (codes int8 [N, K], scale float32 [N]); symmetric per output row.
    ``scale_dtype``: the dtype the kernel keeps the scale in. The codes are rounded against
    the scale as that dtype holds it: rounded afterwards, a bf16 scale would be off by up to
    0.4 % for the whole row at once, an error that does not average out over the row as
    the codes' own rounding does."""
    w = w.float()
    scale = (w.abs().amax(dim=1) / INT8_MAX).clamp(min=1e-12).to(scale_dtype).float()  # [N]
    codes = torch.round(w / scale.unsqueeze(1)).clamp_(-INT8_MAX, INT8_MAX).to(torch.int8)
    return codes, scale


def dequantize_int8(codes: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """(codes int8 [N, K], scale [N]) -> the [N, K] float32 values they stand for."""
    return codes.float() * scale.float().unsqueeze(1)


def quantize_fp8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w [N, K] float -> (codes float8_e4m3fn [N, K], scale float32 [N]), rounded to
    nearest (ties to even); ``fp8_matmul.quantize_rows`` quantises activations the same
    way (its kernel to the same bits)."""
    w = w.float()
    amax = w.abs().amax(dim=1, keepdim=True).clamp(min=FP8_AMAX_FLOOR)  # [N, 1]
    return (w * (FP8_MAX / amax)).to(torch.float8_e4m3fn), (amax / FP8_MAX).squeeze(1)


def dequantize_fp8(codes: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """(codes float8_e4m3fn [N, K], scale [N]) -> the [N, K] float32 values."""
    return codes.float() * scale.float().unsqueeze(1)


def quantize_int4(w: torch.Tensor, group_size: int) -> GroupQuantized:
    """w [N, K] float -> asymmetric group-wise int4 (min/max of each group map to 0/15)."""
    N, K = w.shape
    check_group(K, group_size)
    g = w.float().view(N, K // group_size, group_size)
    lo, hi = g.amin(dim=-1), g.amax(dim=-1)  # [N, K / G]
    scale = ((hi - lo) / INT4_LEVELS).clamp(min=1e-12)
    codes = torch.round((g - lo.unsqueeze(-1)) / scale.unsqueeze(-1)).clamp_(0, INT4_LEVELS)
    return GroupQuantized(codes.to(torch.uint8).view(N, K), scale, lo, group_size, 4)


def check_group(in_features: int, group_size: int) -> None:
    if group_size < 1 or in_features % group_size:
        raise ValueError(f"int4 group size {group_size} does not divide the input width "
                         f"{in_features}; pick a group size that does (e.g. 32)")
