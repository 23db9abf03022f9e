"""Programmatic dependent launch (CUDA, compute capability 9.0+) for our Triton kernels.

A decode step at one token is ~240 short kernels in a row, and each boundary costs the
drain of the previous kernel's last wave plus the launch of the next. With programmatic
dependent launch a kernel lets the next one start once all its programs have issued their
main work (``release``); the next one's programs come up on the multiprocessors the
finishing kernel frees and wait (``wait``) until it has completed and its writes are
visible. Every kernel launched this way waits before it reads or writes anything, and
releases only after its own wait, so completion still chains through the whole step; a
kernel launched without it (cuBLAS, torch ops) orders the stream as usual. On an H200 the
batch-1 decode step went 3.76 -> 3.65 ms (bf16) and 2.62 -> 2.48 ms (int8 weights)
(docs/BENCHMARKS.md, "Programmatic dependent launch and the few-token matmul").

Kernels with a main loop release after it, one-pass kernels right after their wait: a GEMV
that released at its start was slower (the next kernel's waiting programs took the slots
its own later waves needed), and so was prefetching the next weights before the wait.

Kernels take ``PDL: tl.constexpr`` and are launched with ``**pdl.launch(device)``.
``FIRSTTOKEN_PDL=0`` turns it off (for A/B measurements).
"""
from __future__ import annotations

import functools
import os

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs
    triton = None
try:
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
    HAVE_GDC = True
except ImportError:  # no Triton, or one without grid dependency control
    HAVE_GDC = False

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
ENABLED = os.environ.get("FIRSTTOKEN_PDL", "1") != "0"


@functools.lru_cache(maxsize=None)
def _capable(index: int) -> bool:
    return torch.cuda.get_device_capability(index)[0] >= 9


def enabled(device: torch.device) -> bool:
    """Whether kernels on ``device`` launch with programmatic dependent launch."""
    if not (ENABLED and HAVE_GDC and not INTERPRET and device.type == "cuda"):
        return False
    return _capable(device.index if device.index is not None else torch.cuda.current_device())


def launch(device: torch.device, on: bool = True) -> dict:
    """The kernel arguments for a launch on ``device``: the PDL constexpr, and Triton's
    launch option where it is on (``on``: the caller's own switch)."""
    return dict(PDL=True, launch_pdl=True) if on and enabled(device) else dict(PDL=False)


if HAVE_GDC:
    @triton.jit
    def wait(PDL: tl.constexpr):
        """Block until the previous kernel has completed (its writes visible)."""
        if PDL:
            gdc_wait()

    @triton.jit
    def release(PDL: tl.constexpr):
        """Let the next kernel's programs start (they wait for this kernel to complete)."""
        if PDL:
            gdc_launch_dependents()
elif triton is not None:
    @triton.jit
    def wait(PDL: tl.constexpr):
        pass

    @triton.jit
    def release(PDL: tl.constexpr):
        pass
