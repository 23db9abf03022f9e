"""Writes deploy/grafana/dashboards/firsttoken.json (the dashboard is code; edit here, rerun).

    python deploy/grafana/build_dashboard.py            # rewrite the JSON
    python deploy/grafana/build_dashboard.py --check    # exit 1 if the JSON is stale

Every latency panel is a histogram_quantile over the services' own histograms, so percentiles
are exact up to bucket resolution (the gateway's buckets include 2, 4, 6, 8 ms).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parent / "dashboards" / "firsttoken.json"
DS = {"type": "prometheus", "uid": "${datasource}"}
SEL = '{model=~"$model"}'
RI = "[$__rate_interval]"


def q(expr: str, legend: str) -> dict:
    return {"expr": expr, "legendFormat": legend, "datasource": DS}


def quantiles(metric: str, by: str, sel: str = "", qs: tuple[float, ...] = (0.5, 0.99),
              what: str = "") -> list[dict]:
    """p50/p99 of a histogram, one series per `by` label (le is added)."""
    group = f"le, {by}" if by else "le"
    out = []
    for quant in qs:
        expr = (f"histogram_quantile({quant}, sum by ({group}) "
                f"(rate({metric}_bucket{sel}{RI})))")
        label = (f"{{{{{by}}}}} " if by else "") + (f"{what} " if what else "") + f"p{round(quant * 100)}"
        out.append(q(expr, label))
    return out


def recorded(metric: str) -> list[dict]:
    """p50/p99 per model from the recording rules (deploy/prometheus/recording.yml)."""
    return [q(f"model:{metric}:p{p}_rate1m{SEL}", f"{{{{model}}}} p{p}") for p in (50, 99)]


def panel(title: str, targets: list[dict], unit: str, x: int, y: int, w: int = 12,
          h: int = 8, desc: str = "") -> dict:
    return {"type": "timeseries", "title": title, "description": desc, "datasource": DS,
            "gridPos": {"x": x, "y": y, "w": w, "h": h}, "targets": targets,
            "fieldConfig": {"defaults": {"unit": unit, "min": 0}, "overrides": []},
            "options": {"legend": {"displayMode": "table", "placement": "bottom",
                                   "calcs": ["lastNotNull", "max"]},
                        "tooltip": {"mode": "multi", "sort": "desc"}}}


def row(title: str, y: int) -> dict:
    return {"type": "row", "title": title, "collapsed": False, "panels": [],
            "gridPos": {"x": 0, "y": y, "w": 24, "h": 1}}


def panels() -> list[dict]:
    g = "model"
    return [
        row("Latency seen by clients (gateway, per model)", 0),
        panel("TTFT p50 / p99", recorded("gateway_ttft_seconds"), "s", 0, 1,
              desc="Receipt to the first content-bearing delta (role-only chunks don't count). "
                   "Recording rules, 1-minute windows."),
        panel("TPOT p50 / p99", recorded("gateway_tpot_seconds"), "s", 12, 1,
              desc="(last token - first token) / (completion_tokens - 1), from usage. "
                   "Recording rules, 1-minute windows."),
        panel("E2E p50 / p99", quantiles("gateway_e2e_seconds", g, SEL), "s", 0, 9),
        panel("Gateway overhead and upstream TTFB",
              quantiles("gateway_overhead_seconds", g, SEL, what="overhead")
              + quantiles("gateway_upstream_ttfb_seconds", g, SEL, what="upstream TTFB"),
              "s", 12, 9, desc="Time the gateway itself adds, next to the upstream's "
                               "time to response headers."),
        row("Traffic", 17),
        panel("Requests/s by status code",
              [q(f"sum by (code) (rate(gateway_requests_total{SEL}{RI}))", "{{code}}")],
              "reqps", 0, 18, w=8),
        panel("In-flight requests",
              [q(f"sum by (model) (gateway_in_flight_requests{SEL})", "{{model}}")],
              "short", 8, 18, w=8),
        panel("Tokens/s",
              [q(f"sum by (model) (rate(gateway_completion_tokens_total{SEL}{RI}))",
                 "{{model}} completion (gateway)"),
               q(f"sum by (model) (rate(gateway_prompt_tokens_total{SEL}{RI}))",
                 "{{model}} prompt (gateway)"),
               q(f"sum(rate(backend_generation_tokens_total{RI}))", "generated (backend)"),
               q(f"sum(rate(backend_prompt_tokens_total{RI}))", "prompt (backend)"),
               q(f"sum(rate(backend_cached_prompt_tokens_total{RI}))",
                 "prompt from the prefix cache (backend)")],
              "short", 16, 18, w=8),
        panel("Upstream errors and retries /s",
              [q(f"sum by (model, provider) (rate(gateway_upstream_errors_total{SEL}{RI}))",
                 "{{model}} via {{provider}} errors"),
               q(f"sum by (model, provider) (rate(gateway_upstream_retries_total{SEL}{RI}))",
                 "{{model}} via {{provider}} retries")],
              "short", 0, 26, w=24, h=7),
        row("Backend engine", 33),
        panel("Queue vs prefill p50 / p99",
              quantiles("backend_queue_seconds", "", what="queue")
              + quantiles("backend_prefill_seconds", "", what="prefill"), "s", 0, 34,
              desc="Where a request's TTFT goes inside the backend: waiting for a slot, "
                   "then computing its prompt."),
        panel("Backend TTFT / TPOT / E2E p99",
              quantiles("backend_ttft_seconds", "", qs=(0.99,), what="TTFT")
              + quantiles("backend_tpot_seconds", "", qs=(0.99,), what="TPOT")
              + quantiles("backend_e2e_seconds", "", qs=(0.99,), what="E2E"), "s", 12, 34),
        panel("Batch size (sequences per step)",
              quantiles("backend_batch_size", "")
              + [q(f"sum(rate(backend_batch_size_sum{RI})) / sum(rate(backend_batch_size_count{RI}))",
                   "mean")], "short", 0, 42, w=8),
        panel("KV cache blocks",
              [q("sum(backend_kv_blocks_used)", "used"), q("sum(backend_kv_blocks_total)", "total")],
              "short", 8, 42, w=8),
        panel("Running / waiting requests, preemptions/s, eager steps/s",
              [q("sum(backend_requests_running)", "running"),
               q("sum(backend_requests_waiting)", "waiting"),
               q(f"sum(rate(backend_preemptions_total{RI}))", "preemptions/s"),
               q(f"sum(rate(backend_eager_steps_total{RI}))", "eager steps/s")],
              "short", 16, 42, w=8,
              desc="Eager steps: steps that no captured CUDA graph held (the host launches "
                   "every kernel while the GPU waits)."),
        row("TTFT SLO (99% of requests within 1 s)", 50),
        panel("TTFT SLO burn rate",
              [q(f"model:gateway_ttft_slo:burn_rate{w}{SEL}", "{{model}} " + w)
               for w in ("5m", "1h", "6h")], "short", 0, 51, w=24,
              desc="Share of requests over 1 s divided by the 1% error budget (recording "
                   "rules). 1 = the budget lasts exactly the SLO period; the TTFTSLOBurn "
                   "alert pages at 14.4 over 1 h (and 5 min) or 6 over 6 h (and 30 min)."),
    ]


def operator_panels(y: int) -> list[dict]:
    """Routing (gateway/routing.py) and key limits (gateway/limits.py), from row ``y``."""
    return [
        row("Routing and key limits (gateway)", y),
        panel("Route decisions/s by deployment and reason",
              [q(f"sum by (model, deployment, reason) "
                 f"(rate(gateway_route_decisions_total{SEL}{RI}))",
                 "{{model}} → {{deployment}} ({{reason}})")], "reqps", 0, y + 1,
              desc="Why each request went where it did: within_slo / spillover (spillover "
                   "routing), least_ttft, least_in_flight, failover, all_ejected."),
        panel("Ejected deployments",
              [q(f"max by (model, deployment) (gateway_deployment_ejected{SEL})",
                 "{{model}} {{deployment}}")], "short", 12, y + 1,
              desc="1 while a deployment is ejected after consecutive failures."),
        panel("429s per key name (own limits)",
              [q(f"sum by (key, reason) (rate(gateway_rate_limited_total{RI}))",
                 "{{key}} {{reason}}"),
               q(f"sum(rate(gateway_limits_store_errors_total{RI}))",
                 "limits store errors/s")], "reqps", 0, y + 9, w=24, h=7,
              desc="Requests refused by a key's rpm / tpm / max_concurrent, and failed calls "
                   "to the shared Redis store (local counters decided meanwhile)."),
    ]


def dashboard() -> dict:
    ps = panels()
    ps += operator_panels(max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in ps))
    for i, p in enumerate(ps, start=1):
        p["id"] = i
    return {
        "uid": "firsttoken-overview", "title": "firsttoken: latency, traffic, engine",
        "tags": ["firsttoken", "llm", "latency"], "timezone": "browser", "editable": True,
        "schemaVersion": 39, "version": 1, "refresh": "10s",
        "time": {"from": "now-30m", "to": "now"},
        "templating": {"list": [
            {"name": "datasource", "label": "Prometheus", "type": "datasource",
             "query": "prometheus", "current": {}, "hide": 0},
            {"name": "model", "label": "Model", "type": "query", "datasource": DS,
             "query": {"query": "label_values(gateway_requests_total, model)",
                       "refId": "models"},
             "definition": "label_values(gateway_requests_total, model)",
             "includeAll": True, "multi": True, "allValue": ".*", "refresh": 2,
             "current": {"text": "All", "value": "$__all"}, "sort": 1, "hide": 0},
        ]},
        "annotations": {"list": []},
        "panels": ps,
    }


def render() -> str:
    return json.dumps(dashboard(), indent=2) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--check", action="store_true", help="fail if the committed JSON is stale")
    a = p.parse_args(argv)
    text = render()
    if a.check:
        if not OUT.is_file() or OUT.read_text(encoding="utf-8") != text:
            print(f"{OUT} is stale: run python deploy/grafana/build_dashboard.py", file=sys.stderr)
            return 1
        return 0
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(text, encoding="utf-8")
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
