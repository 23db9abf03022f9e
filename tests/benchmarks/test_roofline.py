"""benchmarks.roofline's CPU floors are timed on the threads the engine gets: the copy and
the matmul on one thread (torch.utils.benchmark's default) understated this 2-core VM's floors
by about half, and the ablation's prefill steps then read 139 % of the matmul rate."""
from __future__ import annotations

import torch

from benchmarks import roofline


def test_cpu_floors_are_timed_on_the_engines_threads() -> None:
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        seen: set[int] = set()
        roofline._cpu_seconds(lambda: seen.add(torch.get_num_threads()))
        assert seen == {2}
    finally:
        torch.set_num_threads(before)
