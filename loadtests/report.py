"""Charts (PNG, matplotlib Agg) and a self-contained HTML report for a sweep.

Rows are the dicts the sweep writes to results.json (one per batch size); see
docs/LOADTESTS.md for their fields.
"""
from __future__ import annotations

import argparse
import base64
import html
import json
import math
import os
from typing import Any

SEGMENT_COLORS = {"client side": "#9ecae1", "client + gateway": "#9ecae1", "gateway": "#3182bd",
                  "gateway->backend hop": "#bcbddc", "upstream": "#fdae6b",
                  "backend other": "#c7e9c0", "backend queue": "#fd8d3c", "prefill": "#31a354"}


def _plt() -> Any:
    import matplotlib
    matplotlib.use("Agg")  # headless: no display on servers and CI
    import matplotlib.pyplot as plt
    return plt


def _xaxis(ax: Any, sizes: list[int]) -> None:
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes)
    ax.set_xticklabels([str(s) for s in sizes])
    ax.set_xlabel("batch size (concurrent requests)")
    ax.grid(True, alpha=0.3)


def _nan(v: Any) -> float:
    return math.nan if v is None else float(v)


def chart_ttft(rows: list[dict], slo_ms: float | None, path: str) -> str:
    plt = _plt()
    sizes = [r["batch_size"] for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4.2))
    ax.plot(sizes, [_nan(r["ttft_p50_ms"]) for r in rows], "o-", label="TTFT p50")
    ax.plot(sizes, [_nan(r["ttft_p99_ms"]) for r in rows], "s--", label="TTFT p99")
    for r in rows:  # sample counts under each p99 point: a thin p99 is visible at a glance
        if r["ttft_p99_ms"] is not None:
            ax.annotate(f"n={r['ttft_count']}", (r["batch_size"], r["ttft_p99_ms"]),
                        textcoords="offset points", xytext=(0, 6), ha="center", fontsize=7)
    if slo_ms:
        ax.axhline(slo_ms, color="red", lw=1, ls=":", label=f"SLO {slo_ms:g} ms")
    _xaxis(ax, sizes)
    ax.set_ylabel("TTFT (ms)")
    ax.set_title("Time to first token vs batch size")
    ax.legend()
    return _save(fig, path)


def chart_throughput(rows: list[dict], path: str) -> str:
    plt = _plt()
    sizes = [r["batch_size"] for r in rows]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    ax = axes[0]
    ax.plot(sizes, [_nan(r["tpot_p50_ms"]) for r in rows], "o-", color="purple")
    _xaxis(ax, sizes)
    ax.set_ylabel("TPOT p50 (ms/token)")
    ax.set_title("Time per output token")
    ax = axes[1]
    ax.plot(sizes, [_nan(r["output_tok_s"]) for r in rows], "o-", color="green",
            label="output tok/s")
    _xaxis(ax, sizes)
    ax.set_ylabel("output tokens/s")
    ax.set_title("Throughput, GPU-Util and SM activity")
    util = [r.get("gpu_util_mean_pct") for r in rows]
    ax2 = ax.twinx()
    if any(u is not None for u in util):
        ax2.plot(sizes, [_nan(u) for u in util], "s--", color="black", label="GPU-Util %")
        loaded = [r.get("gpu_util_loaded_mean_pct") for r in rows]
        if any(u is not None for u in loaded):
            ax2.plot(sizes, [_nan(u) for u in loaded], "s-", color="gray",
                     label="GPU-Util % (loaded window)")
        ax2.set_ylim(0, 100)
        ax2.set_ylabel("GPU-Util / SM active (%)")
        _plot_sm_activity(ax, ax2, rows, sizes)
    else:
        ax2.set_yticks([])
        ax.text(0.5, 0.04, "GPU-Util and SM activity: unavailable (no NVIDIA GPU / NVML)",
                transform=ax.transAxes, ha="center", fontsize=8, color="gray")
    lines = ax.get_legend_handles_labels()[0] + ax2.get_legend_handles_labels()[0]
    ax.legend(lines, [str(h.get_label()) for h in lines], loc="upper left")
    fig.tight_layout()
    return _save(fig, path)


def _plot_sm_activity(ax: Any, ax2: Any, rows: list[dict], sizes: list[int]) -> None:
    """GPM SM activity (and tensor activity) beside GPU-Util, which counts any kernel
    running: "GPU-Util 98%, SM active 41%" is the confusion between the two made visible."""
    sm = [r.get("gpu_sm_active_mean_pct") for r in rows]
    if any(v is not None for v in sm):
        ax2.plot(sizes, [_nan(v) for v in sm], "^-", color="crimson", label="SM active %")
        tensor = [r.get("gpu_tensor_active_mean_pct") for r in rows]
        if any(v is not None for v in tensor):
            ax2.plot(sizes, [_nan(v) for v in tensor], "v:", color="darkorange",
                     label="tensor active %")
        return
    reason = next(((r.get("gpu") or {}).get("gpm") or {}).get("reason") for r in rows)
    ax.text(0.5, 0.04, f"SM activity (NVML GPM): unavailable — {reason}"[:110],
            transform=ax.transAxes, ha="center", fontsize=7, color="gray")


def chart_decomposition(rows: list[dict], path: str) -> str:
    plt = _plt()
    labels = [str(r["batch_size"]) for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4.2))
    bottoms = [0.0] * len(rows)
    present = [s for s in SEGMENT_COLORS
               if any((r.get("ttft_decomposition_ms") or {}).get(s) for r in rows)]
    for seg in present:
        vals = [max(0.0, (r.get("ttft_decomposition_ms") or {}).get(seg, 0.0)) for r in rows]
        ax.bar(labels, vals, bottom=bottoms, label=seg, color=SEGMENT_COLORS[seg])
        bottoms = [b + v for b, v in zip(bottoms, vals)]
    ax.plot(labels, [_nan(r["ttft_mean_ms"]) for r in rows], "k_", markersize=18,
            label="client TTFT (mean)")
    ax.set_xlabel("batch size (concurrent requests)")
    ax.set_ylabel("mean TTFT (ms)")
    ax.set_title("Where TTFT goes (joined by x-request-id)")
    ax.legend(fontsize=8)
    ax.grid(True, axis="y", alpha=0.3)
    return _save(fig, path)


def chart_routing(runs: list[dict], slo_ms: float, path: str) -> str:
    """Spillover demo (benchmarks/spillover.py): client TTFT p50/p99 per routing, with
    the SLO, and how many requests/s the local backend served under each."""
    plt = _plt()
    names = [r["routing"] for r in runs]
    xs = range(len(runs))
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    ax.bar([x - 0.2 for x in xs], [_nan(r["ttft_ms"]["p50_ms"]) for r in runs], 0.4,
           label="TTFT p50")
    ax.bar([x + 0.2 for x in xs], [_nan(r["ttft_ms"]["p99_ms"]) for r in runs], 0.4,
           label="TTFT p99")
    ax.axhline(slo_ms, color="red", lw=1, ls=":", label=f"SLO {slo_ms:g} ms (p99)")
    ax.set_xticks(list(xs))
    ax.set_xticklabels(names)
    ax.set_ylabel("client TTFT (ms)")
    ax.set_title("TTFT by routing: local backend past its SLO + cloud")
    ax.legend(fontsize=8)
    ax2.bar(list(xs), [r["local_req_per_s"] for r in runs], 0.5, color="#31a354",
            label="local")
    ax2.bar(list(xs), [r["req_per_s"] - r["local_req_per_s"] for r in runs], 0.5,
            bottom=[r["local_req_per_s"] for r in runs], color="#fdae6b", label="cloud")
    ax2.set_xticks(list(xs))
    ax2.set_xticklabels(names)
    ax2.set_ylabel("requests/s")
    ax2.set_title("Where the requests went")
    ax2.legend(fontsize=8)
    for a in (ax, ax2):
        a.grid(True, axis="y", alpha=0.3)
    return _save(fig, path)


def _save(fig: Any, path: str) -> str:
    fig.savefig(path, dpi=110, bbox_inches="tight")
    import matplotlib.pyplot as plt
    plt.close(fig)
    return path


def write_charts(rows: list[dict], out_dir: str, slo_ms: float | None) -> list[str]:
    """The three charts over the steps that measured something (failed steps have no
    latencies to plot); none when every step failed."""
    rows = [r for r in rows if not r.get("step_failed")]
    if not rows:
        return []
    return [chart_ttft(rows, slo_ms, os.path.join(out_dir, "ttft_vs_batch.png")),
            chart_throughput(rows, os.path.join(out_dir, "tpot_throughput_gpu.png")),
            chart_decomposition(rows, os.path.join(out_dir, "ttft_decomposition.png"))]


_COLUMNS = (("batch_size", "batch"), ("status", "status"), ("requests_ok", "ok"),
            ("requests_failed", "failed"),
            ("ttft_p50_ms", "TTFT p50 ms"), ("ttft_p99_ms", "TTFT p99 ms"),
            ("ttft_count", "n"), ("tpot_p50_ms", "TPOT p50 ms"), ("e2e_p50_ms", "E2E p50 ms"),
            ("output_tok_s", "out tok/s"), ("output_tok_s_steady", "out tok/s, steady"),
            ("goodput_req_s", "goodput req/s"),
            ("gpu_util_mean_pct", "GPU-Util %"),
            ("gpu_util_loaded_mean_pct", "GPU-Util % (loaded)"),
            ("gpu_sm_active_mean_pct", "SM active %"), ("kernel_busy_pct", "kernel-busy %"),
            ("generator_saturated", "gen. saturated"))


def _cell(v: Any) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:.2f}"
    return html.escape(str(v))


def _status(row: dict) -> str:
    if not row.get("step_failed"):
        return "ok"
    errors = row.get("errors") or []
    return f"failed: {errors[0]['error']}" if errors else "failed: no request completed"


def write_html(meta: dict, rows: list[dict], charts: list[str], path: str) -> str:
    """One file, images inline as base64, readable offline and attachable to a ticket."""
    imgs = []
    for c in charts:
        with open(c, "rb") as f:
            b64 = base64.b64encode(f.read()).decode()
        imgs.append(f'<img alt="{html.escape(os.path.basename(c))}" '
                    f'src="data:image/png;base64,{b64}">')
    head = "".join(f"<th>{html.escape(t)}</th>" for _, t in _COLUMNS)
    body = "".join("<tr>" + "".join(f"<td>{_cell(_status(r) if k == 'status' else r.get(k))}"
                                    "</td>" for k, _ in _COLUMNS) + "</tr>" for r in rows)
    warnings = "".join(f"<li>{html.escape(w)}</li>" for w in meta.get("warnings", []))
    verdict = html.escape(meta.get("verdict", ""))
    settings = html.escape("\n".join(f"{k}: {v}" for k, v in meta.get("settings", {}).items()))
    doc = f"""<!doctype html><html><head><meta charset="utf-8">
<title>firsttoken sweep {html.escape(meta.get('label', ''))}</title>
<style>body{{font-family:sans-serif;max-width:1100px;margin:2em auto}}
table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;padding:3px 8px;text-align:right}}
img{{max-width:100%;display:block;margin:1em 0}}.v{{font-size:1.2em;font-weight:bold}}
.w li{{color:#a33}}</style></head><body>
<h1>TTFT vs batch size — {html.escape(meta.get('model', ''))}</h1>
<p class="v">{verdict}</p>
<ul class="w">{warnings}</ul>
<table><tr>{head}</tr>{body}</table>
{''.join(imgs)}
<h2>Settings</h2><pre>{settings}</pre>
<p>Percentiles come from raw per-request records (n = sample count); a p99 from fewer than 100
samples is marked. Files: results.csv, results.json, records under steps/.</p>
</body></html>"""
    with open(path, "w", encoding="utf-8") as f:
        f.write(doc)
    return path


def render_results(results_path: str, out_dir: str) -> str:
    """Charts and report.html again from a sweep's results.json (e.g. one kept under docs/);
    returns the report's path."""
    with open(results_path, encoding="utf-8") as f:
        data = json.load(f)
    meta, rows = data["meta"], data["rows"]
    os.makedirs(out_dir, exist_ok=True)
    charts = write_charts(rows, out_dir, meta.get("settings", {}).get("ttft_slo_ms"))
    return write_html(meta, rows, charts, os.path.join(out_dir, "report.html"))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Render a sweep's charts and report.html from its "
                                            "results.json.")
    p.add_argument("results", help="results.json written by python -m loadtests.sweep")
    p.add_argument("--out", required=True, help="output directory")
    a = p.parse_args(argv)
    print(render_results(a.results, a.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
