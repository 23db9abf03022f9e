"""GPM sampling through a fake NVML, and its honest absence on the CPU."""
from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, generate_latest

from backend.profiling.gpm import GpmCollector, GpmDevice, GpmSampler, sampler_for_device

from .fake_nvml import FakeNvml

BUSY = {2: 41.0, 3: 22.5, 5: 30.0, 10: 55.0}


def scrape(sampler: GpmSampler) -> str:
    reg = CollectorRegistry()
    reg.register(GpmCollector(sampler))
    return generate_latest(reg).decode()


def test_reading_is_ratios_between_two_samples():
    nv = FakeNvml([BUSY])
    dev = GpmDevice(0, nv)
    assert dev.open() and dev.available and dev.name == "Fake H200"
    r = dev.read()
    assert r.as_dict() == {"util": 0.98, "sm_active": 0.41, "sm_occupancy": 0.225,
                           "tensor_active": 0.30, "dram_bandwidth": 0.55}
    dev.close()
    assert nv.live_samples == 0  # every sample freed


def test_refused_metric_is_none_not_zero():
    dev = GpmDevice(0, FakeNvml([BUSY], refused=(5,)))
    assert dev.open()
    assert dev.read().tensor_active is None


def test_sampler_exports_gauges_beside_gpu_util():
    nv = FakeNvml([BUSY] * 1000)
    sampler = GpmSampler(GpmDevice(0, nv), interval_s=0.01)
    assert sampler.start()
    try:
        deadline = time.monotonic() + 10
        while sampler.latest is None and time.monotonic() < deadline:
            time.sleep(0.01)
        text = scrape(sampler)
    finally:
        sampler.stop()
    assert "backend_gpu_gpm_available 1.0" in text
    assert "backend_gpu_sm_active_ratio 0.41" in text
    assert "backend_gpu_util_ratio 0.98" in text
    assert "backend_gpu_dram_bandwidth_ratio 0.55" in text
    assert "backend_gpu_sm_occupancy_ratio 0.225" in text
    assert "backend_gpu_tensor_active_ratio 0.3" in text


def test_unavailable_says_why_and_exports_no_ratio():
    for nv, why in ((FakeNvml(supported=False), "GPM is not supported on GPU 0"),
                    (FakeNvml(init_error="Driver Not Loaded"), "Driver Not Loaded"),
                    (FakeNvml(gpus=0), "no GPU with index 0")):
        sampler = GpmSampler(GpmDevice(0, nv))
        assert not sampler.start()
        text = scrape(sampler)
        assert "backend_gpu_gpm_available 0.0" in text and why in text
        assert "_ratio" not in text
    cpu = sampler_for_device("cpu")
    assert "runs on 'cpu'" in cpu.reason and "no GPU to sample" in scrape(cpu)

