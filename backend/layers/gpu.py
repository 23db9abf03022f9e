"""Facts of the CUDA device that the Triton kernels size their grids by, read once each."""
from __future__ import annotations

import functools

import torch


@functools.lru_cache(maxsize=None)
def _multiprocessors(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def multiprocessors(device: torch.device, off_cuda: int) -> int:
    """The streaming multiprocessors of ``device``; ``off_cuda`` where it is not a GPU (the
    interpreter's grids, tests)."""
    if device.type != "cuda":
        return off_cuda
    return _multiprocessors(device.index if device.index is not None
                            else torch.cuda.current_device())
