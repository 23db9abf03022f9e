"""The runner hands the heap's free pages back after loading: blocks under malloc's mmap
threshold freed between kept ones (as loading leaves them) leave the resident size only
when trimmed."""
from __future__ import annotations

import pytest
import torch

from backend.engine.model_runner import return_freed_heap


def rss_mib() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


def test_freed_blocks_between_kept_ones_leave_the_resident_size():
    if not return_freed_heap():
        pytest.skip("no glibc malloc_trim here")
    blocks = [torch.ones(16384) for _ in range(2048)]  # 64 KiB each, 128 MiB in all
    del blocks[::2]  # 64 MiB of holes the heap's top cannot give back
    before = rss_mib()
    assert return_freed_heap()
    assert before - rss_mib() > 32
    assert all(float(b[0]) == 1.0 for b in blocks)  # the kept ones untouched
