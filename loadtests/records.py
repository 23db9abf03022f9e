"""Raw per-request records (JSONL) and the run summary computed from them.

The master (or the single local process) owns the file; workers ship their records to it in
batches through Locust's custom messages. The summary (``<records>.summary.json``) holds every
percentile with its sample count, and the generator's saturation verdict.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict
from typing import Callable, Iterable

from loadtests.generator import MonitorSamples, verdict
from loadtests.sse import RequestRecord
from loadtests.stats import summarize, thin_p99_warning


def read_records(path: str) -> list[RequestRecord]:
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                d = json.loads(line)
                if d.get("kind", "request") == "request":
                    out.append(RequestRecord.from_dict(d))
    return out


def summary_path(records_path: str) -> str:
    base = records_path[:-len(".jsonl")] if records_path.endswith(".jsonl") else records_path
    return base + ".summary.json"


class RecordSink:
    """Appends records to the JSONL file and counts measured ones; calls ``on_target`` once."""

    def __init__(self, path: str, target: int = 0,
                 on_target: Callable[[], None] | None = None) -> None:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        self.path = path
        self._f = open(path, "w", encoding="utf-8")
        self._target, self._on_target = target, on_target
        self.records: list[RequestRecord] = []
        self.monitor = MonitorSamples()
        self.measured = 0
        self._fired = False

    def add(self, records: Iterable[RequestRecord]) -> None:
        for rec in records:
            self._f.write(rec.to_json() + "\n")
            self.records.append(rec)
            if rec.phase == "measure":
                self.measured += 1
        self._f.flush()
        if self._target and self.measured >= self._target and not self._fired:
            self._fired = True
            if self._on_target:
                self._on_target()

    def close(self) -> None:
        if not self._f.closed:
            self._f.close()


def build_summary(records: list[RequestRecord], settings: dict, samples: MonitorSamples,
                  intended_rate: float) -> dict:
    """Percentiles (with counts) of the measured requests, and the generator verdict."""
    measured = [r for r in records if r.phase == "measure"]
    ok = [r for r in measured if r.ok]
    failed = [r for r in measured if not r.ok]
    metrics = {
        "ttft_s": summarize(r.ttft_s for r in ok),
        "tpot_s": summarize(r.tpot_s for r in ok),
        "itl_s": summarize(g for r in ok for g in r.itl_s),
        "e2e_s": summarize(r.e2e_s for r in ok),
        "queue_s": summarize(r.queue_s for r in measured),
        "ttft_from_intended_s": summarize(r.ttft_from_intended_s for r in ok),
        "prompt_tokens": summarize(r.prompt_tokens for r in ok),
        "completion_tokens": summarize(r.completion_tokens for r in ok),
    }
    warnings = [w for name in ("ttft_s", "tpot_s", "e2e_s")
                if (w := thin_p99_warning(name, metrics[name]))]
    fallback = sum(1 for r in ok if r.tokens_source == "chunks")
    if fallback:
        warnings.append(f"{fallback} responses had no usage: tokens counted from chunks "
                        "(fallback; TPOT may be off when a chunk holds several tokens)")
    span = _span(ok)
    out_tokens = sum(r.completion_tokens or 0 for r in ok)
    errors: dict[str, int] = {}
    for r in failed:
        key = (r.error or "?")[:120]
        errors[key] = errors.get(key, 0) + 1
    return {
        "settings": settings,
        "requests": {"measured": len(measured), "ok": len(ok), "failed": len(failed),
                     "warmup": len(records) - len(measured)},
        "metrics": {k: v.to_dict() for k, v in metrics.items()},
        "duration_s": span,
        "request_rate": len(ok) / span if span else None,
        "output_tokens_per_s": out_tokens / span if span else None,
        # while every client kept sending (``steady_output_rate``); with a request target only
        "output_tokens_per_s_steady": steady_output_rate(
            records, int(settings.get("measure_requests") or 0))[0],
        "tokens_source": {"usage": sum(1 for r in ok if r.tokens_source == "usage"),
                          "chunks": fallback},
        "errors": errors,
        "warnings": warnings,
        "generator": verdict(samples, settings.get("arrival", "closed"), intended_rate,
                             [r.t_start_unix for r in measured]),
    }


def _span(ok: list[RequestRecord]) -> float | None:
    """Wall time from the first measured send to the last measured end."""
    if not ok:
        return None
    start = min(r.t_start_unix for r in ok)
    end = max(r.t_start_unix + (r.e2e_s or 0) for r in ok)
    return end - start if end > start else None


def steady_output_rate(records: list[RequestRecord], target: int) -> tuple[float | None,
                                                                            float | None]:
    """(output tokens/s, window s) while every client kept sending: from the first measured
    send to the end of the ``target``-th measured request to finish (failed ones count, as
    in ``RecordSink``), the moment the generator stops starting requests. A closed loop
    then drains (the clients' last requests finish one by one with nothing sent after
    them), so the rate over the whole measured span (``output_tok_s``) is that of a batch
    shrinking to zero in its last stretch. Here every request counts (warm-up ones, and
    those still running at the window's end) with the tokens that arrived inside the
    window: content chunk i at send + TTFT + the first i inter-token gaps, each worth
    completion_tokens / chunks."""
    measured = [r for r in records if r.phase == "measure"]
    if not measured or target <= 0:
        return None, None
    start = min(r.t_start_unix for r in measured)
    ends = sorted(r.t_start_unix + (r.e2e_s or 0.0) for r in measured)
    end = ends[min(target, len(ends)) - 1]
    if end <= start:
        return None, None
    tokens = 0.0
    for r in records:
        if not r.ok or r.ttft_s is None or not r.completion_tokens:
            continue
        times = [r.t_start_unix + r.ttft_s]
        for gap in r.itl_s:
            times.append(times[-1] + gap)
        inside = sum(1 for t in times if start <= t <= end)
        tokens += inside * r.completion_tokens / len(times)
    return tokens / (end - start), end - start


def write_summary(path: str, summary: dict) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=2, default=_json_default)


def _json_default(obj: object) -> object:
    if hasattr(obj, "__dataclass_fields__"):
        return asdict(obj)  # type: ignore[arg-type]
    raise TypeError(f"not JSON serializable: {type(obj).__name__}")


def format_summary(summary: dict) -> str:
    """A few human lines for the console."""
    from loadtests.stats import Summary
    req = summary["requests"]
    lines = [f"firsttoken: {req['ok']} ok / {req['failed']} failed measured requests "
             f"({req['warmup']} warm-up excluded)"]
    for name in ("ttft_s", "tpot_s", "itl_s", "e2e_s", "queue_s"):
        d = {k: v for k, v in summary["metrics"][name].items() if k != "p99_reliable"}
        lines.append(f"  {name[:-2].upper():5s} {Summary(**d).fmt()}")
    if summary.get("output_tokens_per_s"):
        lines.append(f"  output {summary['output_tokens_per_s']:.1f} tok/s, "
                     f"{summary['request_rate']:.2f} req/s")
    gen = summary["generator"]
    lines.append("  generator: " + ("SATURATED - " + "; ".join(gen["reasons"])
                                    if gen["saturated"] else "ok (not saturated)"))
    lines += [f"  timing noise: {n}" for n in gen.get("timing_noise", [])]
    lines += [f"  warning: {w}" for w in summary["warnings"]]
    return "\n".join(lines)
