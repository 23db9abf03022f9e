"""A real Prometheus (Debian's package) scrapes a real gateway and a real backend (the embedded
SmolLM2) under a short load, with the shipped prometheus.yml and rule files; then every PromQL
expression of the Grafana dashboard and of the rule files is evaluated through its HTTP API
(tests/deploy/promql_exprs.py says what "has data" means)."""
from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Iterator

import promql_parser
import pytest
import yaml

from loadtests.procs import free_port, stop_process
from tests.deploy.promql_exprs import PROMETHEUS_YML, ROOT, as_promql, check, dashboard_exprs, \
    data_parts, rule_exprs, rule_files, text
from tests.deploy.test_prometheus_rules import binary
from tests.loadtests.conftest import start_process

pytest.importorskip("torch")  # the backend extra
openai = pytest.importorskip("openai")

KEY = "sk-prometheus-live-7d2a"
LIMITED_KEY = "sk-prometheus-live-limited-31c9"  # rpm 1: its second request is a 429
MODEL = "smollm2"
BROKEN = "broken"  # an alias whose provider refuses connections: 5xx and upstream errors
# Parts of shipped expressions that have no data after a short test, each with the reason.
# Everything else must return a finite series: a typo in a metric or a label name fails.
NO_DATA_OK = {
    "deriv(sum(backend_requests_waiting)[10m:1m])":
        "a 10-minute subquery at 1-minute steps needs two minutes of history; the test has "
        "seconds",
}
SCRAPE_S = 1.0


def _get_json(url: str, timeout: float = 10.0) -> dict:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read())


def _wait(what: str, ok, timeout_s: float, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"{what}: the process exited with {proc.returncode}")
        try:
            if ok():
                return
        except OSError:
            pass
        time.sleep(0.25)
    raise AssertionError(f"{what} within {timeout_s}s")


class Prometheus:
    def __init__(self, url: str) -> None:
        self.url = url
        self.at: float | None = None  # evaluation time of every query (None: now)

    def api(self, path: str, **params: str) -> dict:
        qs = "?" + urllib.parse.urlencode(params) if params else ""
        doc = _get_json(f"{self.url}/api/v1/{path}{qs}")
        assert doc["status"] == "success", doc
        return doc["data"]

    def query(self, promql: str) -> list[dict]:
        try:
            at = {} if self.at is None else {"time": f"{self.at:.3f}"}
            return self.api("query", query=promql, **at)["result"]
        except urllib.error.HTTPError as e:  # 400/422: a parse or an evaluation error
            raise AssertionError(e.read().decode(errors="replace")) from None

    def has_finite(self, promql: str) -> bool:
        return any(v["value"][1] not in ("NaN", "+Inf", "-Inf") for v in self.query(promql))


def _gateway_config(path: Path, backend: str, dead: str) -> Path:
    doc = {"listen": {"host": "127.0.0.1", "port": 0},
           "keys": [{"name": "live", "env": "GATEWAY_API_KEY", "models": ["*"]},
                    {"name": "limited", "env": "GATEWAY_LIMITED_KEY", "models": ["*"],
                     "rpm": 1}],
           "providers": {"local": {"base_url": backend + "/v1", "timeout_seconds": 120},
                         "down": {"base_url": dead + "/v1", "timeout_seconds": 5,
                                  "max_retries": 1}},
           "models": {MODEL: {"provider": "local", "model": "smollm2-135m-instruct"},
                      BROKEN: {"provider": "down", "model": "nothing"}},
           "request_log": str(path.parent / "requests.jsonl")}
    path.write_text(json.dumps(doc))
    return path


def _prometheus_config(path: Path, targets: dict[str, str]) -> Path:
    """The shipped prometheus.yml with loopback targets, a 1 s scrape and rule interval, and
    absolute rule paths (the test copy lives in a temp dir)."""
    cfg = yaml.safe_load(PROMETHEUS_YML.read_text(encoding="utf-8"))
    cfg["global"].update(scrape_interval=f"{SCRAPE_S:g}s", evaluation_interval=f"{SCRAPE_S:g}s")
    cfg["rule_files"] = [str(p) for p in rule_files()]
    jobs = {job["job_name"]: job for job in cfg["scrape_configs"]}
    assert set(jobs) == set(targets), f"prometheus.yml scrapes {sorted(jobs)}"
    for name, job in jobs.items():
        job["static_configs"] = [{"targets": [targets[name]]}]
    path.write_text(yaml.safe_dump(cfg))
    return path


def _load(gateway: str, streams: int, plain: int) -> None:
    client = openai.OpenAI(base_url=gateway + "/v1", api_key=KEY, max_retries=0, timeout=120)
    msgs = [{"role": "user", "content": "Name three colours."}]
    for _ in range(streams):
        stream = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=4,
                                                stream=True,
                                                stream_options={"include_usage": True})
        assert any(c.usage for c in stream)
    for _ in range(plain):
        r = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=4)
        assert r.usage.completion_tokens > 1
    with pytest.raises(openai.APIStatusError) as err:
        client.chat.completions.create(model=BROKEN, messages=msgs, max_tokens=8)
    assert err.value.status_code >= 500
    limited = openai.OpenAI(base_url=gateway + "/v1", api_key=LIMITED_KEY, max_retries=0,
                            timeout=120)
    with pytest.raises(openai.RateLimitError):  # over the key's rpm: the 429 series exist
        for _ in range(2):
            limited.chat.completions.create(model=MODEL, messages=msgs, max_tokens=2)


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Iterator[dict]:
    tmp = tmp_path_factory.mktemp("prometheus-live")
    procs: list[subprocess.Popen] = []
    try:
        be_port = free_port()
        backend = f"http://127.0.0.1:{be_port}"
        with open(tmp / "backend.log", "w") as log:
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "backend", "--model", "smollm2-135m-instruct",
                 "--port", str(be_port), "--max-num-seqs", "4"],
                cwd=ROOT, stdout=log, stderr=subprocess.STDOUT))
        cfg = _gateway_config(tmp / "gateway.yaml", backend, f"http://127.0.0.1:{free_port()}")
        gw_proc, gateway = start_process([sys.executable, "-m", "gateway", "--config", str(cfg),
                                          "--port", "0"], tmp / "gateway.log",
                                         env={"GATEWAY_API_KEY": KEY,
                                              "GATEWAY_LIMITED_KEY": LIMITED_KEY})
        procs.append(gw_proc)
        prom_port = free_port()
        prom_cfg = _prometheus_config(tmp / "prometheus.yml", {
            "gateway": gateway.removeprefix("http://"), "backend": f"127.0.0.1:{be_port}"})
        with open(tmp / "prometheus.log", "w") as log:
            procs.append(subprocess.Popen(
                [binary("prometheus"), f"--config.file={prom_cfg}",
                 f"--storage.tsdb.path={tmp / 'tsdb'}",
                 f"--web.listen-address=127.0.0.1:{prom_port}", "--log.level=warn"],
                cwd=tmp, stdout=log, stderr=subprocess.STDOUT))
        prom = Prometheus(f"http://127.0.0.1:{prom_port}")
        _wait("backend healthy", lambda: _get_json(backend + "/health", 2) is not None, 240,
              procs[0])
        _wait("Prometheus ready", lambda: urllib.request.urlopen(prom.url + "/-/ready",
                                                                 timeout=2).status == 200,
              60, procs[-1])
        # A first round creates every labelled series; the counters then have to be scraped
        # once before the main round, or rate() sees no increase.
        _load(gateway, streams=1, plain=0)
        _wait("first scrape of the gateway's requests",
              lambda: prom.query('gateway_requests_total{code=~"5.."}'), 30)
        time.sleep(2 * SCRAPE_S)
        _load(gateway, streams=2, plain=1)
        # Both targets scraped after the load, and the rules evaluated on those scrapes.
        _wait("recording rules on the loaded data",
              lambda: prom.has_finite("model:gateway_tpot_seconds:p99_rate1m")
              and prom.has_finite("model:gateway_ttft_slo:burn_rate5m"), 30)
        time.sleep(3 * SCRAPE_S)
        # Every check looks at this moment, so the 1-minute windows still hold the load
        # however long the tests after it take.
        prom.at = time.time()
        yield {"prom": prom, "gateway": gateway, "backend": backend, "dir": tmp}
    finally:
        for p in reversed(procs):
            stop_process(p, grace_s=10)


def test_both_targets_are_up(stack):
    up = {r["metric"]["job"]: r["value"][1] for r in stack["prom"].query("up")}
    assert up == {"gateway": "1", "backend": "1"}


def test_every_dashboard_and_rule_expression_evaluates_with_data(stack):
    exprs = list(dict.fromkeys(dashboard_exprs() + rule_exprs()))
    assert len(exprs) >= 40
    problems = [p for expr in exprs for p in check(expr, stack["prom"].query, set(NO_DATA_OK))]
    assert not problems, "\n".join(problems)
    parts = {text(p) for expr in exprs for p in data_parts(promql_parser.parse(as_promql(expr)))}
    assert set(NO_DATA_OK) <= parts, f"stale NO_DATA_OK entries: {set(NO_DATA_OK) - parts}"


@pytest.mark.parametrize("typo", [
    "histogram_quantile(0.99, sum by (le, model) (rate(gateway_ttft_second_bucket[1m])))",
    'sum by (modle) (rate(gateway_requests_total{model=~"$model"}[1m]))',
    'sum(rate(gateway_requests_total{modle=~"$model"}[$__rate_interval]))',
    "model:gateway_ttft_seconds:p99_rate2m > 1",
    "sum by (le) (rate(gateway_ttft_seconds_bucket[1m])) and sum(rate(backend_x_total[1m]))",
    "sum(rate(gateway_requests_total[1m])) / on (cod) sum by (code) "
    "(rate(gateway_requests_total[1m]))",
    "sum(rate(gateway_requests_total[1m])",
])
def test_the_check_catches_a_typo(stack, typo):
    assert check(typo, stack["prom"].query, set(NO_DATA_OK))


def test_every_rule_group_evaluates_without_errors(stack):
    groups = stack["prom"].api("rules")["groups"]
    assert {g["file"] for g in groups} == {str(p) for p in rule_files()}
    bad = [(r["name"], r.get("lastError")) for g in groups for r in g["rules"]
           if r["health"] != "ok"]
    assert not bad


@pytest.mark.parametrize("server", ["gateway", "backend"])
def test_metrics_have_no_created_series(stack, server):
    with urllib.request.urlopen(stack[server] + "/metrics", timeout=10) as r:
        text = r.read().decode()
    for family in {"gateway": ("gateway_requests_total{", "gateway_ttft_seconds_count{"),
                   "backend": ("backend_generation_tokens_total ", "backend_ttft_seconds_count ")
                   }[server]:
        assert family in text  # counters and histograms with observations are there
    created = [ln for ln in text.splitlines() if "_created" in ln]
    assert not created, created[:5]


def test_the_5xx_share_is_exact(stack):
    """Values too, not only presence: every request to the broken alias failed, none other."""
    share = stack["prom"].query('sum by (model) (rate(gateway_requests_total{code=~"5.."}[5m])) / '
                       "sum by (model) (rate(gateway_requests_total[5m]))")
    assert {r["metric"]["model"]: float(r["value"][1]) for r in share} == {BROKEN: 1.0}
