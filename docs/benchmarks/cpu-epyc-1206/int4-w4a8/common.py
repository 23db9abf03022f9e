"""Set-up shared by this folder's scripts (run from the repository root with PYTHONPATH=.;
a script's own folder is on its import path)."""
import time

from backend.engine.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.engine.sampling import SamplingParams
from backend.layers.linear import Int4Linear
from backend.weights.loader import load_model_source


def keep_torch_packing() -> None:
    """The layers keep torch's int4 packing beside the op's codes, as before they dropped it
    (for the scripts that time torch's kernel on the same layers; call before ``op_layers``)."""
    Int4Linear.release_torch_packing = lambda self: 0


def op_layers(activations: str, copies: bool = False) -> tuple[LLMEngine, list[Int4Linear]]:
    """SmolLM2 on the CPU engine with its int4 layers on the int4 x int8 op in
    ``activations`` parts (built where missing), and those layers; ``copies``: each keeps
    its dense copy too."""
    eng = LLMEngine(EngineConfig(cpu_int4_activations=activations, cpu_aot_kernels="build",
                                 kv_cache_memory_gib=0.1, max_model_len=256, max_num_seqs=16),
                    load_model_source("smollm2-135m-instruct"))
    layers = [m for layer in eng.runner.model.layers for m in layer.modules()
              if isinstance(m, Int4Linear)]
    assert all(m.w4a8 for m in layers), eng.runner.aot_kernels.int4_w4a8
    assert not copies or all(m.prefill_weight is not None for m in layers)
    return eng, layers


def into_decode(eng: LLMEngine, tag: str, batch: int, prompt: int,
                params: SamplingParams) -> None:
    """``batch`` sequences of distinct ``prompt``-token prompts, all prefilled, then three
    warm decode steps."""
    for i in range(batch):
        eng.add_request(f"{tag}-{batch}-{i}", [(7 * i + j) % 4000 + 10 for j in range(prompt)],
                        params)
    while eng.scheduler.waiting or any(not s.is_decode for s in eng.scheduler.running):
        eng.step()
    for _ in range(3):
        eng.step()


def paired_steps(engines: dict[str, LLMEngine], steps: int) -> dict[str, list[float]]:
    """``steps`` rounds of one decode step per engine, each step timed alone (ms), the order
    rotated every round (two engines: swapped); then every engine drained."""
    names = list(engines)
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(steps):
        for n in names[r % len(names):] + names[:r % len(names)]:
            t0 = time.perf_counter()
            engines[n].step()
            times[n].append((time.perf_counter() - t0) * 1e3)
    for eng in engines.values():
        while eng.has_unfinished():
            eng.step()
    return times
