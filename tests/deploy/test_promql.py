"""Every PromQL expression in the Grafana dashboard and the Prometheus rules parses and uses
only metrics the gateway and backend export (the interface list, and the real registries)."""
from __future__ import annotations

import importlib.util
import json
import re
import types

import pytest
import yaml

from tests.deploy.promql_exprs import as_promql, dashboard_exprs, recorded_names, rule_exprs
from tests.deploy.test_assets import DEPLOY, INTERFACE_METRICS, PROMETHEUS_OWN

promql = pytest.importorskip("promql_parser")

_SUFFIXES = {"histogram": ("_bucket", "_sum", "_count"), "counter": ("",), "gauge": ("",)}
# PromQL words that look like identifiers but are not metric names.
_FUNCS = {
    "abs", "absent", "avg", "avg_over_time", "bottomk", "by", "ceil", "changes", "clamp_min",
    "clamp_max", "count", "count_over_time", "delta", "deriv", "group_left", "group_right",
    "histogram_quantile", "idelta", "ignoring", "increase", "irate", "label_replace", "max",
    "max_over_time", "min", "min_over_time", "offset", "on", "predict_linear", "quantile",
    "rate", "round", "sort", "stddev", "sum", "sum_over_time", "time", "topk", "vector",
    "without", "and", "or", "unless", "bool", "le",
}


def allowed_names() -> set[str]:
    names = set(PROMETHEUS_OWN) | recorded_names()
    for base, kind in INTERFACE_METRICS.items():
        names.update(base + s for s in _SUFFIXES[kind])
    return names


def metric_names(expr: str) -> set[str]:
    """Identifiers in metric position: label matchers, strings, ranges, `by (...)` lists and
    function names removed first (a regex extraction, independent of the parser)."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)            # strings
    e = re.sub(r"\{[^}]*\}", "", e)                          # label matchers
    e = re.sub(r"\[[^\]]*\]", "", e)                         # range / subquery selectors
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", e)
    e = re.sub(r"\blabel_values\(\s*([A-Za-z_:][\w:]*)\s*,\s*\w+\s*\)", r"\1", e)
    idents = re.findall(r"(?<![\w.$])([A-Za-z_:][\w:]*)(?![\w:])(?!\s*\()", e)
    return {i for i in idents if i not in _FUNCS}


def test_there_are_expressions_to_check():
    assert len(dashboard_exprs()) >= 25 and len(rule_exprs()) >= 6


@pytest.mark.parametrize("source", ["dashboard", "rules"])
def test_every_expression_parses(source):
    exprs = dashboard_exprs() if source == "dashboard" else rule_exprs()
    for expr in exprs:
        promql.parse(as_promql(expr))  # raises on a syntax error


@pytest.mark.parametrize("source", ["dashboard", "rules"])
def test_metric_names_are_exported_ones(source):
    exprs = dashboard_exprs() if source == "dashboard" else rule_exprs()
    allowed = allowed_names()
    used: set[str] = set()
    for expr in exprs:
        names = metric_names(expr)
        assert names, f"no metric found in {expr!r}"
        unknown = names - allowed
        assert not unknown, f"{sorted(unknown)} in {expr!r} is not an exported metric"
        used |= names
    if source == "dashboard":
        # The panels docs/DEPLOY.md lists: each family appears somewhere (directly, or through a
        # recording rule named level:metric:operation).
        for base in ("gateway_ttft_seconds", "gateway_tpot_seconds", "gateway_e2e_seconds",
                     "gateway_overhead_seconds", "gateway_requests_total",
                     "gateway_in_flight_requests", "backend_queue_seconds",
                     "backend_prefill_seconds", "backend_batch_size", "backend_kv_blocks_used",
                     "backend_kv_blocks_total", "backend_preemptions_total",
                     "backend_generation_tokens_total", "gateway_completion_tokens_total"):
            assert any(u.startswith(base) or f":{base}:" in u for u in used), \
                f"dashboard lacks {base}"


def test_the_regex_extraction_itself():
    expr = ('histogram_quantile(0.99, sum by (le, model) (rate(gateway_ttft_seconds_bucket'
            '{model=~"a|b", code="500"}[5m]))) > 1e-3 and deriv(sum(backend_requests_waiting)'
            '[10m:1m]) > 0 unless on (model) up == 0')
    assert metric_names(expr) == {"gateway_ttft_seconds_bucket", "backend_requests_waiting", "up"}
    assert metric_names("label_values(gateway_requests_total, model)") == {"gateway_requests_total"}
    assert metric_names("sum(rate(gateway_ttft_seconds[5m]))") - allowed_names() == \
        {"gateway_ttft_seconds"}  # a histogram without a suffix is not a series


def registry_names(registry) -> set[str]:
    out = set()
    for fam in registry.collect():
        kind = fam.type if fam.type in _SUFFIXES else "gauge"
        base = fam.name + ("_total" if fam.type == "counter" else "")
        out.update(base + s for s in _SUFFIXES[kind])
    return out


def test_names_match_the_real_registries():
    exported = set(PROMETHEUS_OWN)
    if importlib.util.find_spec("gateway.metrics"):
        from gateway.metrics import Metrics as GatewayMetrics
        exported |= registry_names(GatewayMetrics().registry)
    if importlib.util.find_spec("backend.server.metrics"):
        from backend.server.metrics import Metrics as BackendMetrics
        stats = types.SimpleNamespace(running=0, waiting=0, kv_blocks_used=0, kv_blocks_total=1,
                                      preemptions_total=0, prompt_tokens_total=0,
                                      generation_tokens_total=0, attention_kernel="sdpa",
                                      cached_prompt_tokens_total=0)
        exported |= registry_names(BackendMetrics(lambda: stats).registry)
    if exported == set(PROMETHEUS_OWN):
        pytest.skip("neither gateway.metrics nor backend.server.metrics is importable")
    prefixes = {n.split("_")[0] for n in exported - PROMETHEUS_OWN}
    for expr in dashboard_exprs() + rule_exprs():
        for name in metric_names(expr):
            if name.split("_")[0] in prefixes or name in PROMETHEUS_OWN:
                assert name in exported, f"{name} is not exported by the real registry"


def test_dashboard_json_is_what_the_generator_writes():
    path = DEPLOY / "grafana" / "build_dashboard.py"
    spec = importlib.util.spec_from_file_location("ft_build_dashboard", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main(["--check"]) == 0, "run python deploy/grafana/build_dashboard.py"
    doc = json.loads(mod.render())
    ids = [p["id"] for p in doc["panels"]]
    assert len(ids) == len(set(ids))
    for p in doc["panels"]:
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24


def test_grafana_provisioning_points_at_the_dashboards():
    prov = yaml.safe_load((DEPLOY / "grafana" / "provisioning" / "dashboards"
                           / "firsttoken.yml").read_text())
    path = prov["providers"][0]["options"]["path"]
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    mounts = dict(v.split(":")[:2] for v in compose["services"]["grafana"]["volumes"]
                  if v.startswith("./"))
    assert mounts["./grafana/dashboards"] == path
    ds = yaml.safe_load((DEPLOY / "grafana" / "provisioning" / "datasources"
                         / "prometheus.yml").read_text())
    assert ds["datasources"][0]["url"] == "http://prometheus:9090"
