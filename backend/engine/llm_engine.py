"""The synchronous engine: requests in, one scheduled step at a time, outputs out.

``step()`` = schedule -> launch the model and the sampler on the flat batch -> read the
sampled ids (the step's one host sync) -> append tokens, check stops, free finished
sequences. With ``async_scheduling`` the ids read are the previous step's, while the
device runs the step just launched. AsyncEngine drives it from its own thread; tests and
benchmarks can drive it directly (``generate``).
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Callable

import torch

from backend.engine.block_manager import BlockManager
from backend.engine.config import EngineConfig
from backend.engine.errors import RequestRejected
from backend.engine.model_runner import ModelRunner, SampledIds
from backend.engine.nvtx import NvtxRanges
from backend.engine.outputs import EngineStats, RequestOutput, RequestTimings, StepStats
from backend.engine.sampling import SamplingParams
from backend.engine.scheduler import ScheduledBatch, Scheduler
from backend.engine.sequence import Sequence, SeqStatus
from backend.engine.step_inputs import pending_token

log = logging.getLogger(__name__)


class LLMEngine:
    def __init__(self, config: EngineConfig, source,
                 step_observer: Callable[[StepStats], None] | None = None,
                 model=None) -> None:
        """``model``: an already built LlamaModel of the same source to share (benchmarks
        and tests comparing engine settings on one set of weights)."""
        cfg = source.config
        limit = cfg.max_position_embeddings
        if config.max_model_len is not None and config.max_model_len > limit:
            raise ValueError(f"max_model_len {config.max_model_len} exceeds the model's "
                             f"max_position_embeddings {limit}")
        self.config = config
        self.max_model_len = config.max_model_len or limit
        self.nvtx = NvtxRanges(config.nvtx, config.nvtx_prefix)
        self.runner = ModelRunner(config, source, self.max_model_len, self.nvtx, model)
        self.block_manager = BlockManager(self.runner.num_blocks, config.block_size,
                                          config.enable_prefix_caching)
        self.scheduler = Scheduler(self.block_manager, config.max_num_seqs,
                                   config.max_num_batched_tokens, config.scheduling == "static",
                                   config.max_prefill_tokens, config.prefill_priority,
                                   self.runner.graph_prefill_chunks())
        self.eos = frozenset(source.tokenizer.eos_token_ids)
        self.step_observer = step_observer
        self.seqs: dict[str, Sequence] = {}
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.async_scheduling = config.async_scheduling if config.async_scheduling \
            is not None else self.runner.device.type == "cuda"
        self._in_flight: _Launched | None = None  # launched, sampled ids not yet read
        self._last_collected_ns = 0  # when the previous in-flight step's ids were read

    # -- requests ---------------------------------------------------------------------
    def check_request(self, prompt_len: int, params: SamplingParams) -> None:
        if prompt_len < 1:
            raise RequestRejected("the prompt is empty (0 tokens)", "prompt")
        if prompt_len + 1 > self.max_model_len:
            raise RequestRejected(
                f"the prompt has {prompt_len} tokens but the model's context is "
                f"{self.max_model_len} tokens (at least 1 must be left for the completion)",
                "messages")
        total = min(prompt_len + params.max_tokens, self.max_model_len)
        need = self.block_manager.blocks_for(total)
        if need > self.block_manager.num_blocks:
            raise RequestRejected(
                f"the request needs {total} tokens of KV cache ({need} blocks) but the "
                f"cache holds {self.block_manager.num_blocks * self.config.block_size} tokens "
                f"({self.block_manager.num_blocks} blocks); lower max_tokens or the prompt",
                "max_tokens")

    def add_request(self, request_id: str, prompt_token_ids: list[int],
                    params: SamplingParams, arrival_ns: int | None = None) -> None:
        self.check_request(len(prompt_token_ids), params)
        if request_id in self.seqs:
            raise ValueError(f"duplicate request id {request_id!r}")
        seq = Sequence(request_id, list(prompt_token_ids), len(prompt_token_ids), params)
        if arrival_ns is not None:
            seq.arrival_ns = arrival_ns
        if params.seed is not None:
            seq.generator = torch.Generator(device=self.runner.device)
            seq.generator.manual_seed(params.seed)
        self.seqs[request_id] = seq
        self.prompt_tokens_total += len(prompt_token_ids)
        self.scheduler.add(seq)

    def abort_request(self, request_id: str) -> RequestOutput | None:
        """Frees the request's blocks at once; None when it is unknown or already done."""
        seq = self.seqs.pop(request_id, None)
        if seq is None:
            return None
        self.scheduler.finish(seq, "abort")
        live = self._in_flight is not None and \
            any(self.seqs.get(s.request_id) is s for s in self._in_flight.sampled)
        if not live:
            self._in_flight = None  # nothing left to read from it
        return self._output(seq, [])

    def has_unfinished(self) -> bool:
        return self.scheduler.has_work() or self._in_flight is not None

    # -- stepping ---------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """One scheduled step. With ``async_scheduling`` the step is launched and the
        previous step's sampled ids are read while the device runs it: the outputs returned
        are the previous step's (a sequence whose input token is still on the device takes
        it from there). A sequence that stopped in the previous step and is also in this one
        has that extra token discarded; one known to end (max_tokens, context) is never
        launched again. Without it the step's own outputs are returned.

        When the model or the sampler raises, the step is re-run on halves of the batch
        until the sequences that break it are found: those finish with
        ``finish_reason == "error"`` (their blocks freed), every other one gets its token
        exactly as in a clean step. A failed run leaves no trace (``num_computed`` moves on
        only after a launch succeeds, and re-writing the same K/V slots is harmless)."""
        t0 = time.perf_counter_ns()
        with self.nvtx.range("schedule"):
            batch = self.scheduler.schedule()
        if batch.num_seqs == 0 and self._in_flight is None:
            return []
        outputs: list[RequestOutput] = []
        launched = None
        if batch.num_seqs:
            try:
                launched = self._launch(batch)
            except Exception as exc:  # noqa: BLE001 - isolate the culprits, keep the rest
                log.warning("engine step of %d sequences failed (%s: %s); isolating the "
                            "failing requests", batch.num_seqs, type(exc).__name__, exc)
                outputs += self._collect_in_flight()  # its tokens are this batch's inputs
                batch = self._still_running(batch)
                if batch.num_seqs:
                    outputs += self._run_isolating(batch, exc)
        outputs += self._collect_in_flight()
        if launched is not None:
            self._after_launch(launched)
            if self.async_scheduling:
                self._in_flight = launched
            else:
                outputs += self._collect(launched)
        if batch.num_seqs and (launched is None or not self.async_scheduling):
            self._observe(batch, time.perf_counter_ns() - t0,
                          launched.graphed if launched is not None else None)
        return outputs

    def _observe(self, batch: ScheduledBatch, duration_ns: int, graphed: bool | None) -> None:
        if self.step_observer is None:
            return
        stats = StepStats(batch.num_seqs, batch.num_prefill_tokens, len(batch.decodes),
                          duration_ns / 1e9, len(batch.prefills), graphed)
        try:
            self.step_observer(stats)
        except Exception:  # noqa: BLE001 - a metrics bug must not fail the requests
            log.exception("step observer failed")

    def _launch(self, batch: ScheduledBatch) -> _Launched:
        """Queue the batch on the device and commit its progress; raises before committing.
        Each sampled sequence gets a pending placeholder as its newest token."""
        sampled = batch.sampled_seqs()  # before num_computed moves on
        ids = self.runner.launch(batch)
        for seq in batch.decodes:
            seq.num_computed += 1
        for seq, n in batch.prefills:
            seq.num_computed += n
        slots = []
        for row, seq in enumerate(sampled):
            slots.append(len(seq.token_ids))
            seq.token_ids.append(pending_token(row))
        return _Launched(batch, sampled, slots, ids, time.perf_counter_ns(),
                         self.runner.last_graphed)

    def _after_launch(self, launched: _Launched) -> None:
        """Once the previous step's tokens are known: register the full blocks of the
        launched step (their tokens are all known now), and finish the sequences that end
        with the token being sampled (max_tokens or the context), so that no later step
        runs them. Their blocks may be reused at once: the device runs steps in order."""
        batch = launched.batch
        for seq in batch.decodes + [s for s, _ in batch.prefills]:
            if seq.status is SeqStatus.RUNNING:
                self.block_manager.register_computed(seq)
        for seq, slot in zip(launched.sampled, launched.slots):
            if seq.status is SeqStatus.RUNNING and self._ends_at_length(seq, slot):
                self.scheduler.finish(seq, "length")

    def _ends_at_length(self, seq: Sequence, slot: int) -> bool:
        return slot + 1 - seq.num_prompt_tokens >= seq.params.max_tokens or \
            slot + 1 >= self.max_model_len

    def _collect_in_flight(self) -> list[RequestOutput]:
        """Read the in-flight step. Its step statistics are reported here, for its own
        batch: from its launch, or from the previous step's read if later (the device runs
        steps in order), to this read; timing step() instead would charge a decode step
        with the wait for the prefill launched before it."""
        launched, self._in_flight = self._in_flight, None
        if launched is None:
            return []
        outputs = self._collect(launched)
        now = time.perf_counter_ns()
        self._observe(launched.batch, now - max(launched.launched_ns, self._last_collected_ns),
                      launched.graphed)
        self._last_collected_ns = now
        return outputs

    def _collect(self, launched: _Launched) -> list[RequestOutput]:
        """Read a launched step's sampled ids (the step's one host sync) and append them."""
        tokens = launched.ids.tolist()
        outputs, live = [], self.seqs
        for seq, slot, token in zip(launched.sampled, launched.slots, tokens):
            if live.get(seq.request_id) is not seq:
                continue  # aborted, failed or stopped meanwhile: the token is discarded
            outputs.append(self._append(seq, slot, token))
        return outputs

    def _still_running(self, batch: ScheduledBatch) -> ScheduledBatch:
        """batch without the sequences that finished since it was scheduled."""
        def live(seq: Sequence) -> bool:
            return seq.status is SeqStatus.RUNNING
        return ScheduledBatch([s for s in batch.decodes if live(s)],
                              [(s, n) for s, n in batch.prefills if live(s)])

    def _run(self, batch: ScheduledBatch) -> list[RequestOutput]:
        """Run the batch to its sampled tokens (no step in flight); raises before
        committing anything."""
        launched = self._launch(batch)
        self._after_launch(launched)
        return self._collect(launched)

    def _run_isolating(self, batch: ScheduledBatch, exc: Exception) -> list[RequestOutput]:
        """Bisect a failed batch: halves that run are committed, a single sequence that
        still fails alone is failed (``exc`` is the error it raised)."""
        if batch.num_seqs == 1:
            seq = batch.decodes[0] if batch.decodes else batch.prefills[0][0]
            log.error("request %s fails the engine step alone (%s: %s); failing it",
                      seq.request_id, type(exc).__name__, exc)
            return [self._fail(seq, f"{type(exc).__name__}: {exc}")]
        outputs = []
        for half in _halves(batch):
            try:
                outputs += self._run(half)
            except Exception as sub_exc:  # noqa: BLE001 - narrow it down further
                outputs += self._run_isolating(half, sub_exc)
        return outputs

    def _fail(self, seq: Sequence, error: str) -> RequestOutput:
        self.seqs.pop(seq.request_id, None)
        self.scheduler.finish(seq, "error")
        out = self._output(seq, [])
        out.error = error
        return out

    def _append(self, seq: Sequence, slot: int, token: int) -> RequestOutput:
        """The sampled token of ``seq`` at index ``slot`` is known: put it in place of its
        placeholder, check the stops, hand out what is new."""
        seq.token_ids[slot] = token
        self.generation_tokens_total += 1
        if seq.first_token_ns is None:
            seq.first_token_ns = time.perf_counter_ns()
        p, reason = seq.params, None
        stop_token = token in p.stop_token_ids or (not p.ignore_eos and token in self.eos)
        if stop_token:
            reason = "stop"
        elif self._ends_at_length(seq, slot):
            reason = "length"
        new = seq.take_new_tokens(slot + 1)
        if reason is not None:
            del seq.token_ids[slot + 1:]  # a token launched after the stop is dropped
            self.scheduler.finish(seq, reason)
            self.seqs.pop(seq.request_id, None)
            if stop_token:
                new = new[:-1]  # the EOS / stop token ends the stream; it is not content
        return self._output(seq, new)

    def _output(self, seq: Sequence, new: list[int]) -> RequestOutput:
        finished = seq.status is SeqStatus.FINISHED
        return RequestOutput(seq.request_id, new, finished, seq.finish_reason,
                             seq.num_prompt_tokens, seq.num_cached_tokens,
                             _timings(seq) if finished else None)

    def stats(self) -> EngineStats:
        bm, graphs = self.block_manager, self.runner.graphs
        return EngineStats(len(self.scheduler.running), len(self.scheduler.waiting),
                           bm.num_used, bm.num_blocks, self.scheduler.preemptions_total,
                           self.prompt_tokens_total, self.generation_tokens_total,
                           self.runner.attention_kernel,
                           str(self.runner.dtype).removeprefix("torch."),
                           *self.runner.weights_info(),
                           lm_head_kernel=self.runner.lm_head_kernel(),
                           cpu_aot_kernels=self.runner.aot_kernels.as_dict(),
                           prefill_dense_weights=self.runner.prefill_dense.as_dict(),
                           gpu_copy_rows=self.runner.gpu_copy_rows.as_dict(),
                           weights_scaling=self.runner.weights_scaling.as_dict(),
                           compile=self.runner.compile_info.as_dict(),
                           async_scheduling=self.async_scheduling,
                           decode_kernels_per_step=dict(graphs.kernels_per_step)
                           if graphs is not None else {},
                           cuda_graphs=graphs.describe() if graphs is not None else None,
                           max_prefill_seqs=self.scheduler.max_prefill_seqs,
                           cached_prompt_tokens_total=self.scheduler.cached_prompt_tokens_total)

    @torch.inference_mode()
    def score(self, token_ids: list[int], chunk: int | None = None) -> torch.Tensor:
        """Logits at every position of token_ids, [T, vocab] float32, computed through the
        paged cache (so a quantised KV dtype applies): perplexity and agreement checks.
        ``chunk``: fed ``chunk`` tokens a forward pass (each after the K/V of those before
        it), so the layers run the kernels of steps that size (decode's, at 1-8) rather
        than a prefill's."""
        seq = Sequence("score", list(token_ids), len(token_ids), SamplingParams())
        if self.block_manager.blocks_for(len(seq)) > self.block_manager.num_free:
            raise RuntimeError("not enough free KV blocks to score this text")
        self.block_manager.allocate(seq, use_prefix_cache=False)
        step = chunk or len(seq)
        parts = []
        try:
            while seq.num_computed < len(seq):
                n = min(step, len(seq) - seq.num_computed)
                ids, pos, attn, meta, _ = self.runner.prepare(ScheduledBatch([], [(seq, n)]))
                rows = torch.arange(n, device=self.runner.device)
                parts.append(self.runner.model.forward(ids, pos, attn, meta, rows))
                seq.num_computed += n
            return torch.cat(parts)
        finally:
            self.block_manager.free_seq(seq)

    def generate(self, prompts: list[list[int]], params: SamplingParams | list[SamplingParams],
                 max_steps: int = 100_000) -> list[list[int]]:
        """Blocking convenience for tests and benchmarks: all prompts at once."""
        plist = params if isinstance(params, list) else [params] * len(prompts)
        ids = [f"gen-{i}-{time.perf_counter_ns()}" for i in range(len(prompts))]
        for rid, prompt, p in zip(ids, prompts, plist):
            self.add_request(rid, prompt, p)
        out = {rid: [] for rid in ids}
        for _ in range(max_steps):
            if not self.has_unfinished():
                break
            for o in self.step():
                out[o.request_id].extend(o.new_token_ids)
        return [out[rid] for rid in ids]


@dataclass
class _Launched:
    """A step queued on the device whose sampled ids are not read yet."""

    batch: ScheduledBatch
    sampled: list[Sequence]  # the sequences that get a token, in row order
    slots: list[int]  # where each one's placeholder sits in its token_ids
    ids: SampledIds
    launched_ns: int  # perf_counter_ns when it was queued
    graphed: bool | None  # whether a CUDA graph ran it (None: no graphs)


def _halves(batch: ScheduledBatch) -> tuple[ScheduledBatch, ScheduledBatch]:
    """Split a batch of at least two sequences into two non-empty batches."""
    items = [(s, None) for s in batch.decodes] + list(batch.prefills)
    mid = len(items) // 2

    def part(chunk: list) -> ScheduledBatch:
        return ScheduledBatch([s for s, n in chunk if n is None],
                              [(s, n) for s, n in chunk if n is not None])
    return part(items[:mid]), part(items[mid:])


def _timings(seq: Sequence) -> RequestTimings:
    arrival, end = seq.arrival_ns, seq.finished_ns or time.perf_counter_ns()
    sched = seq.first_scheduled_ns or end
    first = seq.first_token_ns or end
    s = 1e-9
    return RequestTimings(queue_s=(sched - arrival) * s, prefill_s=(first - sched) * s,
                          first_token_s=(first - arrival) * s, decode_s=(end - first) * s,
                          e2e_s=(end - arrival) * s)
