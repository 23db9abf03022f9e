"""A Triton kernel compiled for sm_90 on a host without a GPU (Triton's bundled ptxas and
cuobjdump), for reading what the GPU would run: its SASS and registers a thread.

    from benchmarks.sass import compile_sm90
    k = compile_sm90(kernel, {"x_ptr": "*bf16", ...}, {"BLOCK_N": 64, ...}, ["x_ptr", "K"])
"""
from __future__ import annotations

import os
import re
import subprocess
import tempfile
from dataclasses import dataclass

import triton
from triton.backends.compiler import GPUTarget

BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")


@dataclass
class Compiled:
    sass: str
    registers: int
    shared_bytes: int

    def count(self, pattern: str, start: int = 0, stop: int | None = None) -> int:
        """SASS lines [start, stop) matching ``pattern``."""
        return sum(bool(re.search(pattern, s)) for s in self.sass.splitlines()[start:stop])

    def around_the_wait(self) -> dict:
        """Registers, local-memory spills, and global loads (LDG) and cp.async copies
        (LDGSTS) before and after the first ``griddepcontrol.wait`` (ACQBULK in SASS)."""
        lines = self.sass.splitlines()
        wait = next((i for i, s in enumerate(lines) if "ACQBULK" in s), len(lines))
        return {"registers": self.registers, "spills": self.count(r"\b(STL|LDL)\b"),
                "shared_bytes": self.shared_bytes,
                "ldg_before_wait": self.count(r"\bLDG\.", 0, wait),
                "ldg_after_wait": self.count(r"\bLDG\.", wait),
                "ldgsts": self.count(r"\bLDGSTS"),
                "instructions": self.count(r"^\s+/\*[0-9a-f]{4}\*/")}


def jit_fn(kernel):
    """The JITFunction under wrappers such as ``launch.fast``."""
    while not isinstance(kernel, triton.runtime.jit.JITFunction):
        kernel = kernel.fn
    return kernel


def compile_sm90(kernel, types: dict[str, str], consts: dict, aligned: list[str],
                 num_warps: int, num_stages: int) -> Compiled:
    """``kernel`` with argument types ``types`` (the rest i32), constexprs ``consts`` and
    the arguments in ``aligned`` marked divisible by 16, as the engine's tensors are."""
    fn = jit_fn(kernel)
    names = fn.arg_names
    sig = {n: "constexpr" if n in consts else types.get(n, "i32") for n in names}
    src = triton.compiler.ASTSource(
        fn=fn, signature=sig, constexprs={(names.index(k),): v for k, v in consts.items()},
        attrs={(names.index(n),): [["tt.divisibility", 16]] for n in aligned if n in names})
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                       options=dict(num_warps=num_warps, num_stages=num_stages))
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(k.asm["cubin"])
        f.flush()
        usage = subprocess.run([os.path.join(BIN, "cuobjdump"), "--dump-resource-usage",
                                f.name], capture_output=True, text=True).stdout
        sass = subprocess.run([os.path.join(BIN, "cuobjdump"), "--dump-sass", f.name],
                              capture_output=True, text=True).stdout
    return Compiled(sass, int(re.search(r"REG:(\d+)", usage).group(1)), k.metadata.shared)
