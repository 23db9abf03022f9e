"""Where an AOTInductor CPU package crashes at load on a host: builds one package (a trivial
module, or the int8 GEMV of backend.layers.cpu_aot) and loads it in a fresh process, each step
printed before it runs, so the last line before a SIGSEGV names the step.
    python probe.py build trivial|gemv DIR     then     python probe.py load trivial|gemv DIR
(``load`` as backend.layers.cpu_aot loads; ``public`` through torch._inductor.aoti_load_package;
``path-only`` the loader with its defaults)
"""
import sys
from pathlib import Path

import torch
from torch import nn


class Trivial(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2 + 1


def module_and_args(kind: str) -> tuple[nn.Module, tuple]:
    if kind == "trivial":
        return Trivial(), (torch.randn(4, 8),)
    from backend.layers.cpu_aot import Int8Gemv
    n, k = 256, 128
    return Int8Gemv(), (torch.randn(1, k), torch.randint(-127, 127, (n, k), dtype=torch.int8),
                        torch.rand(n) + 0.5)


def say(*a) -> None:
    print(*a, flush=True)


def main() -> None:
    step, kind, directory = sys.argv[1:4]
    path = Path(directory) / f"{kind}.pt2"
    module, args = module_and_args(kind)
    if step == "build":
        from torch._inductor import aoti_compile_and_package
        say("export")
        program = torch.export.export(module, args)
        say("compile")
        aoti_compile_and_package(program, package_path=str(path))
        say("built", path, path.stat().st_size)
        return
    say("openmp in this process:", sorted({line.split()[-1] for line in open("/proc/self/maps")
                                           if "omp" in line.split()[-1]}))
    loader_cls = torch._C._aoti.AOTIModelPackageLoader
    say("loader", loader_cls, (loader_cls.__init__.__doc__ or "").strip().splitlines()[-1:])
    if step == "public":  # torch._inductor's loader, as aoti_load_package calls it
        from torch._inductor import aoti_load_package
        say("construct (aoti_load_package)")
        loader = aoti_load_package(str(path)).loader
    elif step == "path-only":
        say("construct (path, model)")
        loader = loader_cls(str(path), "model")
    else:
        say("construct (path, model, False, 1, -1)")
        loader = loader_cls(str(path), "model", False, 1, -1)
    say("constructed")
    out = loader.run(list(args))
    say("ran", [tuple(o.shape) for o in out])
    want = module(*args)
    say("max abs diff", (out[0] - want).abs().max().item())


if __name__ == "__main__":
    main()
