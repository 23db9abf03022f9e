"""Paged KV cache storage: one tensor for all layers, addressed by flat slot index.

Layout ``[num_layers, num_blocks * block_size, 2, num_kv_heads, head_dim]``: a slot is one
token position of one block; index 0 of the third dim is K, 1 is V. Keeping K and V side by
side lets one ``index_select`` read both, and the Triton kernels load a token's K and V
rows from neighbouring addresses.

Quantised dtypes keep a float32 scale per (token, K/V, head) beside the blocks, laid out
``[num_layers, 2, num_kv_heads, slots]`` so that the scales of one head's consecutive
tokens are adjacent (the attention kernels load a tile's scales in one coalesced read):
- int8: symmetric, scale = amax / 127, values rounded and clamped to [-127, 127];
- fp8_e4m3: scale = amax / 448 (the format's largest finite value), stored as uint8 bits
  because index_copy_/index_select are not implemented for float8 on every backend.
Where the Triton kernels read the cache (``kernel_layout``), int8 V is stored transposed
within each block: the ``block_size x head_dim`` bytes of one block's V rows for one head
hold element (dim d, token t) at ``d * block_size + t`` (``v_transposed_index``), so that the
decode kernel reads a block's tokens of one dimension as one contiguous run
(``triton_attention._kv_tile``). K keeps one row per token.
A cache for the torch path (``kernel_layout=False``: the sdpa and math backends) keeps V in
rows, read with K in one ``index_select`` (the transposed bytes would cost it a scattered
gather and its index arithmetic in every layer of every step), and its scales per token,
``[num_layers, slots, 2, num_kv_heads]``: one ``index_select`` gathers a context's scales
as the dense ``[N, 2, kvh]`` that multiplies its values, and a step's K and V are quantised
together and written with one copy each (codes, scales).
``write``/``gather`` are the pure-torch reference path (quantise on write, dequantise on
read) of the sdpa and math backends; the Triton backend quantises in its store kernel and
dequantises inside its attention kernels (``triton_attention``).
"""
from __future__ import annotations

import torch

_FP8_MAX = 448.0
_INT8_MAX = 127.0
TRANSPOSED_V = ("int8",)  # cache dtypes whose V is transposed within each block


def kv_storage_dtype(kv_cache_dtype: str, model_dtype: torch.dtype) -> torch.dtype:
    return {"auto": model_dtype, "int8": torch.int8, "fp8_e4m3": torch.uint8}[kv_cache_dtype]


def bytes_per_block(num_layers: int, block_size: int, num_kv_heads: int, head_dim: int,
                    kv_cache_dtype: str, model_dtype: torch.dtype) -> int:
    """Bytes one block takes across all layers (K and V, plus scales when quantised)."""
    elem = torch.empty((), dtype=kv_storage_dtype(kv_cache_dtype, model_dtype)).element_size()
    per_token = 2 * num_kv_heads * head_dim * elem
    if kv_cache_dtype != "auto":
        per_token += 2 * num_kv_heads * 4  # float32 scales
    return num_layers * block_size * per_token


class KVCache:
    def __init__(self, num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int,
                 head_dim: int, model_dtype: torch.dtype, kv_cache_dtype: str,
                 device: torch.device, kernel_layout: bool = True) -> None:
        """``kernel_layout``: int8 V and the scales in the Triton kernels' layout (above);
        False where only ``write`` / ``gather`` read the cache."""
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.model_dtype = model_dtype
        self.kv_cache_dtype = kv_cache_dtype
        # One extra block past the managed ones: a scratch slot where padded rows of a
        # fixed-shape (CUDA graph) decode write their K/V without touching real blocks.
        slots = (num_blocks + 1) * block_size
        self.scratch_slot = num_blocks * block_size
        storage = kv_storage_dtype(kv_cache_dtype, model_dtype)
        # zeros, not empty: padded decode rows gather slot 0 and must not see NaN garbage
        # (masked out anyway, but NaN * 0 in a matmul would still poison the row).
        self.data = torch.zeros(num_layers, slots, 2, num_kv_heads, head_dim,
                                dtype=storage, device=device)
        self.kernel_layout = kernel_layout
        self.v_transposed = kernel_layout and kv_cache_dtype in TRANSPOSED_V
        self.scales = None
        if kv_cache_dtype != "auto":
            shape = ((num_layers, 2, num_kv_heads, slots) if kernel_layout
                     else (num_layers, slots, 2, num_kv_heads))
            self.scales = torch.zeros(shape, dtype=torch.float32, device=device)

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """slots: [T] long; k, v: [T, kvh, hd] in the model dtype."""
        if self.scales is not None and not self.kernel_layout:
            q, scale = quantise(torch.stack((k, v), 1), self.kv_cache_dtype)  # [T, 2, kvh]
            self.data[layer].index_copy_(0, slots, q)
            self.scales[layer].index_copy_(0, slots, scale)
            return
        for c, x in enumerate((k, v)):
            if self.scales is None:
                self.data[layer, :, c].index_copy_(0, slots, x)
                continue
            q, scale = quantise(x, self.kv_cache_dtype)
            if c == 1 and self.v_transposed:
                self._v_rows(layer)[self._v_index(slots)] = q.transpose(1, 2)
            else:
                self.data[layer, :, c].index_copy_(0, slots, q)
            self.scales[layer, c].index_copy_(1, slots, scale.t())  # [kvh, slots]

    def gather(self, layer: int, idx: torch.Tensor,
               dtype: torch.dtype | None = None) -> torch.Tensor:
        """idx: [...] long slot indices -> [..., 2, kvh, hd] in the model dtype; a quantised
        cache's values in ``dtype`` where given."""
        flat = idx.reshape(-1)
        kv = self.data[layer].index_select(0, flat)
        if self.v_transposed:
            kv[:, 1] = self._v_rows(layer)[self._v_index(flat)].transpose(1, 2)
        if self.scales is not None:
            kv = dequantise(kv, self.scales_at(layer, flat), self.kv_cache_dtype,
                            dtype or self.model_dtype)
        return kv.view(*idx.shape, *kv.shape[1:])

    def _v_rows(self, layer: int) -> torch.Tensor:
        """Quantised V storage of one layer as [slots, hd, kvh] (a view)."""
        return self.data[layer, :, 1].transpose(1, 2)

    def _v_index(self, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return v_transposed_index(slots, self.block_size, self.data.shape[-1])

    def scales_at(self, layer: int, slots: torch.Tensor) -> torch.Tensor:
        """slots: [N] long -> [N, 2, kvh] float32 scales (dense: they multiply every value
        of the gathered rows)."""
        if not self.kernel_layout:
            return self.scales[layer].index_select(0, slots)
        return self.scales[layer].index_select(2, slots).permute(2, 0, 1).contiguous()


def v_transposed_index(slots: torch.Tensor, block_size: int,
                       head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """slots: [N] long -> (slot, position in the row) [N, head_dim] each, where dimension d
    of each slot's quantised V value lies (the same for every head)."""
    t = (slots % block_size).unsqueeze(1)  # [N, 1]
    f = torch.arange(head_dim, device=slots.device) * block_size + t  # [N, hd]
    return slots.unsqueeze(1) - t + f // head_dim, f % head_dim


def quantise(x: torch.Tensor, kind: str) -> tuple[torch.Tensor, torch.Tensor]:
    """[..., hd] -> (stored values [..., hd], float32 scales [...]), one scale per row."""
    x = x.float()
    top = _INT8_MAX if kind == "int8" else _FP8_MAX
    scale = (x.abs().amax(dim=-1) / top).clamp_(min=1e-12)  # [...]
    y = x / scale.unsqueeze(-1)
    if kind == "int8":
        return y.round_().clamp_(-_INT8_MAX, _INT8_MAX).to(torch.int8), scale
    return y.to(torch.float8_e4m3fn).view(torch.uint8), scale


def dequantise(q: torch.Tensor, scale: torch.Tensor, kind: str,
               dtype: torch.dtype) -> torch.Tensor:
    """Stored values [..., hd] and scales [...] -> [..., hd] in ``dtype``."""
    # converted first, then scaled in place: an int8 x float32 multiply broadcasting a
    # strided scale took torch's slow loop on the CPU (2-10 against 1.1 ms for 9,000
    # tokens' K/V); the same products either way
    x = q.float() if kind == "int8" else q.view(torch.float8_e4m3fn).float()
    return x.mul_(scale.unsqueeze(-1)).to(dtype)
