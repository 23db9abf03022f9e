"""A fake of the few pynvml calls GPM sampling makes (the seam ``nvml=``): a GPU whose
SM activity etc. follow a script, one entry per metrics read."""
from __future__ import annotations

from types import SimpleNamespace


class NVMLError(Exception):
    pass


class _MetricsGet:
    def __init__(self) -> None:
        self.version = self.numMetrics = 0
        self.sample1 = self.sample2 = None
        self.metrics = [SimpleNamespace(metricId=0, nvmlReturn=0, value=0.0)
                        for _ in range(8)]


class FakeNvml:
    NVML_GPM_METRIC_SM_UTIL = 2
    NVML_GPM_METRIC_SM_OCCUPANCY = 3
    NVML_GPM_METRIC_ANY_TENSOR_UTIL = 5
    NVML_GPM_METRIC_DRAM_BW_UTIL = 10
    NVML_GPM_METRICS_GET_VERSION = 1
    NVMLError = NVMLError
    c_nvmlGpmMetricsGet_t = _MetricsGet

    def __init__(self, script: list[dict[int, float]] | None = None, util: float = 98.0,
                 supported: bool = True, gpus: int = 1, init_error: str | None = None,
                 refused: tuple[int, ...] = ()) -> None:
        self.script = list(script or [])
        self.util = util
        self.supported = supported
        self.gpus = gpus
        self.init_error = init_error
        self.refused = refused  # metric ids answered with an error code
        self.live_samples = 0

    def nvmlInit(self) -> None:
        if self.init_error:
            raise NVMLError(self.init_error)

    def nvmlDeviceGetCount(self) -> int:
        return self.gpus

    def nvmlDeviceGetHandleByIndex(self, i: int) -> str:
        return f"gpu{i}"

    def nvmlDeviceGetName(self, handle: str) -> str:
        return "Fake H200"

    def nvmlGpmQueryDeviceSupport(self, handle: str) -> SimpleNamespace:
        return SimpleNamespace(isSupportedDevice=int(self.supported))

    def nvmlGpmSampleAlloc(self) -> list:
        self.live_samples += 1
        return []

    def nvmlGpmSampleGet(self, handle: str, sample: list) -> None:
        sample.append(handle)

    def nvmlGpmSampleFree(self, sample: list) -> None:
        self.live_samples -= 1

    def nvmlGpmMetricsGet(self, get: _MetricsGet) -> None:
        assert get.sample1 and get.sample2 and get.version == 1
        values = self.script.pop(0) if self.script else {}
        for m in get.metrics[:get.numMetrics]:
            m.nvmlReturn = 1 if m.metricId in self.refused else 0
            m.value = values.get(m.metricId, 0.0)

    def nvmlDeviceGetMemoryInfo(self, handle: str) -> SimpleNamespace:
        return SimpleNamespace(total=140 * 2**30, used=100 * 2**30)

    def nvmlDeviceGetUtilizationRates(self, handle: str) -> SimpleNamespace:
        return SimpleNamespace(gpu=self.util, memory=10)
