"""The sweep's HTML report in a real browser (headless Chromium, Debian's `chromium` package):
it renders, every chart image decodes, and the page logs no error. Reports come from the recorded
H200 sweep under docs/benchmarks/ and from a tiny synthetic CPU run (no GPU, a failed step)."""
from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from loadtests import report

from . import chromium
from .conftest import ROOT

pytest.importorskip("matplotlib")

RECORDED = ROOT / "docs" / "benchmarks" / "gpu-sweep" / "results.json"
# What the page looks like to a reader: every image decoded, with its size, and the text parts.
PROBE = """(async () => {
  const imgs = [...document.images];
  await Promise.all(imgs.map(i => i.decode().catch(() => null)));
  return {
    images: imgs.map(i => ({alt: i.alt, complete: i.complete, w: i.naturalWidth,
                            h: i.naturalHeight, shown: i.getBoundingClientRect().width})),
    h1: document.querySelector("h1") && document.querySelector("h1").textContent,
    verdict: document.querySelector(".v") && document.querySelector(".v").textContent,
    rows: document.querySelectorAll("table tr").length,
    height: document.documentElement.scrollHeight,
  };
})()"""


def _synthetic(path: Path) -> Path:
    """Two batch sizes on a CPU machine: no GPU-Util, the second step failed entirely."""
    base = {"requests_failed": 0, "ttft_count": 12, "tpot_p50_ms": 30.0, "e2e_p50_ms": 400.0,
            "output_tok_s": 20.0, "goodput_req_s": 1.5, "gpu_util_mean_pct": None,
            "generator_saturated": False}
    rows = [{**base, "batch_size": 1, "requests_ok": 12, "ttft_p50_ms": 80.0,
             "ttft_p99_ms": 95.0, "ttft_mean_ms": 82.0,
             "ttft_decomposition_ms": {"client side": 2.0, "gateway": 0.5, "prefill": 70.0}},
            {**base, "batch_size": 2, "requests_ok": 0, "requests_failed": 12, "ttft_count": 0,
             "ttft_p50_ms": None, "ttft_p99_ms": None, "ttft_mean_ms": None,
             "tpot_p50_ms": None, "output_tok_s": None, "ttft_decomposition_ms": {}}]
    meta = {"label": "tiny", "model": "smollm2", "verdict": "No batch size met the SLO.",
            "warnings": ["p99 from 12 samples (< 100)", "batch 2: every request failed"],
            "settings": {"ttft_slo_ms": 90.0}}
    path.write_text(json.dumps({"meta": meta, "rows": rows}))
    return path


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


@pytest.mark.parametrize("source", ["recorded", "synthetic"])
def test_report_renders_in_chromium(tmp_path, source):
    results = RECORDED if source == "recorded" else _synthetic(tmp_path / "results.json")
    data = json.loads(results.read_text())
    rows = data["rows"]
    html = report.render_results(str(results), str(tmp_path / "out"))
    res = chromium.open_page(Path(html).as_uri(), PROBE, screenshot=True)
    assert res.errors == []
    page = res.value
    assert [i["alt"] for i in page["images"]] == ["ttft_vs_batch.png", "tpot_throughput_gpu.png",
                                                   "ttft_decomposition.png"]
    for img in page["images"]:
        assert img["complete"] and img["w"] > 300 and img["h"] > 200, img
        assert 0 < img["shown"] <= chromium.WIDTH  # scaled into the page, never wider
    assert page["h1"].startswith("TTFT vs batch size") and data["meta"]["model"] in page["h1"]
    assert page["verdict"]
    assert page["rows"] == len(rows) + 1  # header + one per batch size
    width, height = _png_size(res.screenshot)
    assert width == chromium.WIDTH and height == page["height"] > 1000


def test_the_check_sees_broken_images_and_errors(tmp_path):
    """A page with a corrupt chart, a console error and an uncaught exception: all three show."""
    page = tmp_path / "broken.html"
    page.write_text('<!doctype html><html><body><h1>x</h1>'
                    '<img alt="bad.png" src="data:image/png;base64,iVBORw0KGgoAAAANSUhEUg">'
                    '<script>console.error("chart missing"); null.x;</script></body></html>')
    res = chromium.open_page(page.as_uri(), PROBE)
    (img,) = res.value["images"]
    assert img["w"] == 0
    assert any("chart missing" in e for e in res.errors)
    assert any(e.startswith("exception: TypeError") for e in res.errors)
