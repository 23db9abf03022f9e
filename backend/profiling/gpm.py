"""SM activity beside GPU-Util: NVML GPU Performance Monitoring (GPM) metrics.

NVML's GPU-Util is the share of time in which *any* kernel ran; one tiny kernel on one SM
counts as 100%. GPM (Hopper and newer, driver R520+) measures how busy the SMs really are:
SM activity, SM occupancy, tensor-core activity, DRAM bandwidth utilisation. A reading is
the difference of two GPM samples taken ``interval`` apart. Reached through nvidia-ml-py
(``pynvml``); the module object is a parameter (``nvml=``) so tests drive a fake NVML.
Where GPM is unavailable (no NVML, no GPU, pre-Hopper, a VM or MIG without it) the reason
is kept and reported; nothing is estimated and no zero is invented.
"""
from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Iterator

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

log = logging.getLogger(__name__)

# our name -> (pynvml metric id constant, help text); NVML reports each in percent 0..100
METRICS = {
    "sm_active": ("NVML_GPM_METRIC_SM_UTIL", "Share of SMs busy (GPM SM activity)"),
    "sm_occupancy": ("NVML_GPM_METRIC_SM_OCCUPANCY",
                     "Resident warps / the SMs' maximum (GPM SM occupancy)"),
    "tensor_active": ("NVML_GPM_METRIC_ANY_TENSOR_UTIL",
                      "Share of time the SMs ran any tensor-core instruction"),
    "dram_bandwidth": ("NVML_GPM_METRIC_DRAM_BW_UTIL",
                       "DRAM bandwidth used / the theoretical maximum"),
}


@dataclass
class GpmReading:
    """Ratios 0..1 over the last interval; a metric NVML refused is None."""
    util: float | None  # NVML GPU-Util (any kernel running), for comparison
    sm_active: float | None
    sm_occupancy: float | None
    tensor_active: float | None
    dram_bandwidth: float | None

    def as_dict(self) -> dict[str, float | None]:
        return dict(self.__dict__)


def load_nvml() -> ModuleType | None:
    """pynvml, or None when nvidia-ml-py is not installed."""
    try:
        import pynvml  # optional dependency: the backend and loadtest extras carry it
    except ImportError:
        return None
    return pynvml


class GpmDevice:
    """GPM on one GPU: ``open()`` says whether it works (and why not), ``read()`` returns the
    metrics since the previous ``read()`` (the first call only takes the first sample)."""

    def __init__(self, index: int = 0, nvml: Any = None) -> None:
        self.index = index
        self._nvml = nvml
        self._handle = None
        self._prev = None
        self.reason: str | None = "not opened"
        self.name: str | None = None

    @property
    def available(self) -> bool:
        return self.reason is None

    def open(self) -> bool:
        nv = self._nvml if self._nvml is not None else load_nvml()
        if nv is None:
            self.reason = "nvidia-ml-py (pynvml) is not installed"
            return False
        self._nvml = nv
        try:
            nv.nvmlInit()
            if self.index >= nv.nvmlDeviceGetCount():
                self.reason = f"NVML sees no GPU with index {self.index}"
                return False
            self._handle = nv.nvmlDeviceGetHandleByIndex(self.index)
            self.name = str(nv.nvmlDeviceGetName(self._handle))
            if not nv.nvmlGpmQueryDeviceSupport(self._handle).isSupportedDevice:
                self.reason = f"GPM is not supported on GPU {self.index} ({self.name})"
                return False
            self._prev = self._sample()
        except Exception as exc:  # noqa: BLE001 - NVMLError, missing symbol in an old driver
            self.reason = f"NVML/GPM unavailable: {exc}"
            return False
        self.reason = None
        return True

    def _sample(self) -> Any:
        nv = self._nvml
        sample = nv.nvmlGpmSampleAlloc()
        nv.nvmlGpmSampleGet(self._handle, sample)
        return sample

    def read(self) -> GpmReading:
        """Metrics between the previous sample and now (call at a steady interval)."""
        nv = self._nvml
        cur = self._sample()
        prev, self._prev = self._prev, cur
        try:
            get = nv.c_nvmlGpmMetricsGet_t()
            get.version = nv.NVML_GPM_METRICS_GET_VERSION
            get.numMetrics = len(METRICS)
            get.sample1, get.sample2 = prev, cur
            for i, (const, _) in enumerate(METRICS.values()):
                get.metrics[i].metricId = getattr(nv, const)
            nv.nvmlGpmMetricsGet(get)
            values = {}
            for i, key in enumerate(METRICS):
                m = get.metrics[i]
                values[key] = None if m.nvmlReturn != 0 else _ratio(m.value)
        finally:
            nv.nvmlGpmSampleFree(prev)
        util = nv.nvmlDeviceGetUtilizationRates(self._handle).gpu
        return GpmReading(util=_ratio(util), **values)

    def close(self) -> None:
        if self._prev is not None:
            try:
                self._nvml.nvmlGpmSampleFree(self._prev)
            except Exception:  # noqa: BLE001 - shutting down anyway
                pass
            self._prev = None


def _ratio(pct: float) -> float:
    return min(max(float(pct) / 100.0, 0.0), 1.0)


class GpmSampler:
    """Reads one GPU's GPM metrics every ``interval_s`` in a daemon thread; ``latest`` is the
    newest reading (None until the first interval has passed)."""

    def __init__(self, device: GpmDevice, interval_s: float = 1.0) -> None:
        self.device = device
        self.interval_s = interval_s
        self.latest: GpmReading | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def reason(self) -> str | None:
        return self.device.reason

    def start(self) -> bool:
        if not self.device.open():
            log.info("GPU SM activity not exported: %s", self.device.reason)
            return False
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="gpm-sampler", daemon=True)
        self._thread.start()
        return True

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.latest = self.device.read()
            except Exception as exc:  # noqa: BLE001 - report it instead of stale numbers
                self.device.reason = f"GPM read failed: {exc}"
                self.latest = None
                return

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        self.device.close()


def unavailable_sampler(reason: str) -> GpmSampler:
    """A sampler that never starts and says why (the engine runs on the CPU, ...)."""
    device = GpmDevice()
    device.reason = reason
    return GpmSampler(device)


class GpmCollector(Collector):
    """``backend_gpu_*`` gauges at scrape time: the ratios when GPM works, and always
    ``backend_gpu_gpm_available`` (1/0) with ``backend_gpu_gpm_info{reason}`` when not."""

    def __init__(self, sampler: GpmSampler, prefix: str = "backend_gpu") -> None:
        self._sampler = sampler
        self._prefix = prefix

    def collect(self) -> Iterator[Metric]:
        reason = self._sampler.reason
        yield GaugeMetricFamily(f"{self._prefix}_gpm_available",
                                "1 when NVML GPM metrics (SM activity ...) are sampled, else 0",
                                value=1 if reason is None else 0)
        if reason is not None:
            info = GaugeMetricFamily(f"{self._prefix}_gpm_info",
                                     "Why GPM metrics are not exported (value is always 1)",
                                     labels=["reason"])
            info.add_metric([reason], 1)
            yield info
            return
        reading = self._sampler.latest
        if reading is None:
            return  # first interval not over yet: absent, not zero
        docs = {k: doc for k, (_, doc) in METRICS.items()}
        docs["util"] = "NVML GPU-Util: share of time any kernel ran"
        for key, value in reading.as_dict().items():
            if value is not None:
                yield GaugeMetricFamily(f"{self._prefix}_{key}_ratio", f"{docs[key]} (0..1)",
                                        value=value)


def sampler_for_device(device: str, nvml: Any = None, interval_s: float = 1.0) -> GpmSampler:
    """A started sampler for the engine's device ("cuda", "cuda:N"), or one that says why
    there is nothing to sample ("cpu"). NVML indices are physical: with CUDA_VISIBLE_DEVICES
    remapping, cuda:N may be another NVML index (documented in docs/PROFILING.md)."""
    if not device.startswith("cuda"):
        return unavailable_sampler(f"the engine runs on {device!r}: no GPU to sample")
    index = int(device.partition(":")[2] or 0)
    sampler = GpmSampler(GpmDevice(index, nvml), interval_s)
    sampler.start()
    return sampler
