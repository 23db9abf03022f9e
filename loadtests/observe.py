"""What the sweep watches besides the client: Prometheus /metrics deltas and GPU samples (NVML).

GPU sampling uses nvidia-ml-py (``pynvml``). Without an NVIDIA GPU or driver the sample is
recorded as unavailable, with the reason; nothing is estimated or faked. Beside GPU-Util (any
kernel running) it samples NVML's GPM metrics where the GPU has them (SM activity, SM
occupancy, tensor activity, DRAM bandwidth: how busy the SMs really are); where it does not,
the reason is recorded instead.
"""
from __future__ import annotations

import threading
import time
import urllib.request
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from backend.profiling.gpm import GpmDevice, load_nvml
from loadtests.stats import summarize

# GPM reading field -> samples list name (percent, like GPU-Util)
_GPM_FIELDS = {"sm_active": "sm_active_pct", "sm_occupancy": "sm_occupancy_pct",
               "tensor_active": "tensor_active_pct", "dram_bandwidth": "dram_bw_pct"}

Snapshot = dict[str, float]  # "name{label=value,...}" -> value


def scrape(url: str | None, timeout_s: float = 5.0, token: str | None = None) -> Snapshot | None:
    """Samples of every ``gateway_*``/``backend_*`` metric at ``url``; None when unreachable."""
    if not url:
        return None
    req = urllib.request.Request(url)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            text = resp.read().decode("utf-8", errors="replace")
    except OSError:
        return None
    out: Snapshot = {}
    for family in text_string_to_metric_families(text):
        if not family.name.startswith(("gateway_", "backend_")):
            continue
        for s in family.samples:
            if s.name.endswith("_bucket") or s.name.endswith("_created"):
                continue  # sums and counts are enough for means; buckets bloat the JSON
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}"] = float(s.value)
    return out


def delta(before: Snapshot | None, after: Snapshot | None) -> dict[str, float] | None:
    """Counter/histogram increase over a step; gauges (no _total/_sum/_count) keep their end value."""
    if after is None:
        return None
    before = before or {}
    out = {}
    for key, value in after.items():
        name = key.split("{", 1)[0]
        if name.endswith(("_total", "_sum", "_count")):
            out[key] = value - before.get(key, 0.0)
        else:
            out[key] = value
    return out


def histogram_means(d: dict[str, float] | None, prefix: str) -> dict[str, float]:
    """``{metric: mean seconds}`` over the step, summed across label sets, from _sum/_count."""
    if not d:
        return {}
    sums: dict[str, float] = {}
    counts: dict[str, float] = {}
    for key, value in d.items():
        name = key.split("{", 1)[0]
        if not name.startswith(prefix):
            continue
        if name.endswith("_sum"):
            sums[name[:-4]] = sums.get(name[:-4], 0.0) + value
        elif name.endswith("_count"):
            counts[name[:-6]] = counts.get(name[:-6], 0.0) + value
    return {n: sums[n] / counts[n] for n in sums if counts.get(n)}


@dataclass
class GpuSamples:
    available: bool
    reason: str | None = None
    name: str | None = None
    t_unix: list[float] = field(default_factory=list)  # wall time of each sample
    util_pct: list[float] = field(default_factory=list)
    mem_used_mib: list[float] = field(default_factory=list)
    mem_total_mib: float | None = None
    gpm_reason: str | None = "not sampled"  # None: GPM metrics below are real samples
    sm_active_pct: list[float] = field(default_factory=list)
    sm_occupancy_pct: list[float] = field(default_factory=list)
    tensor_active_pct: list[float] = field(default_factory=list)
    dram_bw_pct: list[float] = field(default_factory=list)

    def gpm_summary(self) -> dict:
        if self.gpm_reason is not None:
            return {"available": False, "reason": self.gpm_reason}
        return {"available": True, **{name: summarize(getattr(self, name)).to_dict()
                                      for name in _GPM_FIELDS.values()}}

    def summary(self) -> dict:
        if not self.available:
            return {"available": False, "reason": self.reason,
                    "gpm": {"available": False, "reason": self.reason}}
        return {"available": True, "name": self.name,
                "util_pct": summarize(self.util_pct).to_dict(),
                "mem_used_mib": summarize(self.mem_used_mib).to_dict(),
                "mem_total_mib": self.mem_total_mib, "gpm": self.gpm_summary(),
                # the raw series, so a figure can be taken over any window afterwards
                "series": {"t_unix": self.t_unix, "util_pct": self.util_pct,
                           "sm_active_pct": self.sm_active_pct
                           if self.gpm_reason is None else []}}


class GpuSampler:
    """Samples GPU-Util, memory and GPM metrics of every visible GPU (averaged across GPUs)
    in a thread. ``nvml``: the pynvml module or a stand-in (tests); default pynvml."""

    def __init__(self, interval_s: float = 0.2, nvml: object = None) -> None:
        self._interval = interval_s
        self._nvml = nvml
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._gpm: list[GpmDevice] = []
        self.samples = GpuSamples(available=False)

    def start(self) -> None:
        try:
            pynvml = self._nvml or load_nvml()
            if pynvml is None:
                raise RuntimeError("nvidia-ml-py (pynvml) is not installed")
            pynvml.nvmlInit()
            handles = [pynvml.nvmlDeviceGetHandleByIndex(i)
                       for i in range(pynvml.nvmlDeviceGetCount())]
            if not handles:
                raise RuntimeError("NVML sees no GPU")
        except Exception as exc:  # no driver / no GPU / nvidia-ml-py missing
            self.samples = GpuSamples(available=False, reason=f"NVML unavailable: {exc}")
            return
        name = pynvml.nvmlDeviceGetName(handles[0])
        total = sum(pynvml.nvmlDeviceGetMemoryInfo(h).total for h in handles) / 2**20
        self.samples = GpuSamples(available=True, name=str(name), mem_total_mib=total)
        self._gpm = [GpmDevice(i, pynvml) for i in range(len(handles))]
        reasons = [d.reason for d in self._gpm if not d.open()]
        self.samples.gpm_reason = reasons[0] if reasons else None
        if reasons:
            self._gpm = []
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, args=(pynvml, handles), daemon=True)
        self._thread.start()

    def _run(self, pynvml: object, handles: list) -> None:
        while not self._stop.wait(self._interval):
            util = [pynvml.nvmlDeviceGetUtilizationRates(h).gpu for h in handles]  # type: ignore[attr-defined]
            mem = [pynvml.nvmlDeviceGetMemoryInfo(h).used for h in handles]  # type: ignore[attr-defined]
            self.samples.t_unix.append(time.time())
            self.samples.util_pct.append(sum(util) / len(util))
            self.samples.mem_used_mib.append(sum(mem) / 2**20)
            if self._gpm:
                self._sample_gpm()

    def _sample_gpm(self) -> None:
        readings = [d.read().as_dict() for d in self._gpm]
        for key, name in _GPM_FIELDS.items():
            got = [r[key] for r in readings if r[key] is not None]
            if got:
                getattr(self.samples, name).append(100.0 * sum(got) / len(got))

    def stop(self) -> GpuSamples:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        for d in self._gpm:
            d.close()
        return self.samples


def window_means(gpu: dict, t0: float, t1: float) -> dict[str, float | int | None]:
    """GPU-Util and SM-active means over the samples taken between ``t0`` and ``t1`` (unix
    seconds) of a ``GpuSamples.summary()``: the figure of a loaded window, without the load
    generator's start-up and drain around it."""
    series = (gpu or {}).get("series") or {}
    t = series.get("t_unix") or []
    inside = [i for i, ts in enumerate(t) if t0 <= ts <= t1]
    out: dict[str, float | int | None] = {"samples": len(inside)}
    for name in ("util_pct", "sm_active_pct"):
        values = series.get(name) or []
        got = [values[i] for i in inside if i < len(values)]
        out[name] = sum(got) / len(got) if got else None
    return out


def wait_http_ok(url: str, timeout_s: float, interval_s: float = 0.5) -> bool:
    """Poll ``url`` until it answers 200 (a server coming up); False on timeout."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == 200:
                    return True
        except OSError:
            pass
        time.sleep(interval_s)
    return False
