"""The deployment assets under deploy/ parse and agree with the code they start.

Flags are checked against the real parsers (`python -m gateway --help`, `python -m backend
--help`); if a module cannot start, against the interface flag lists in docs/ARCHITECTURE.md
and the issues. Metric names in PromQL are checked against the interface list and, when the
modules import, against the names the real registries expose.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"

INTERFACE_METRICS = {
    "gateway_ttft_seconds": "histogram", "gateway_tpot_seconds": "histogram",
    "gateway_itl_seconds": "histogram", "gateway_e2e_seconds": "histogram",
    "gateway_overhead_seconds": "histogram", "gateway_upstream_ttfb_seconds": "histogram",
    "gateway_requests_total": "counter", "gateway_prompt_tokens_total": "counter",
    "gateway_completion_tokens_total": "counter", "gateway_in_flight_requests": "gauge",
    "gateway_upstream_retries_total": "counter", "gateway_upstream_errors_total": "counter",
    "gateway_route_decisions_total": "counter", "gateway_deployment_ejected": "gauge",
    "gateway_rate_limited_total": "counter", "gateway_limits_store_errors_total": "counter",
    "backend_ttft_seconds": "histogram", "backend_tpot_seconds": "histogram",
    "backend_queue_seconds": "histogram", "backend_prefill_seconds": "histogram",
    "backend_e2e_seconds": "histogram", "backend_batch_size": "histogram",
    "backend_requests_running": "gauge", "backend_requests_waiting": "gauge",
    "backend_kv_blocks_used": "gauge", "backend_kv_blocks_total": "gauge",
    "backend_preemptions_total": "counter", "backend_prompt_tokens_total": "counter",
    "backend_generation_tokens_total": "counter", "backend_eager_steps_total": "counter",
    "backend_cached_prompt_tokens_total": "counter",
}
PROMETHEUS_OWN = {"up"}  # Prometheus's own scrape-health series
FALLBACK_FLAGS = {
    "gateway": {"--config", "--host", "--port"},
    "backend": {"--model", "--device", "--dtype", "--host", "--port", "--max-num-seqs",
                "--max-num-batched-tokens", "--scheduling", "--attention", "--kv-cache-dtype",
                "--kv-cache-memory", "--block-size", "--cuda-graph", "--no-cuda-graph", "--nvtx"},
}
HEALTH_PATHS = {"gateway": {"/healthz", "/readyz", "/metrics"}, "backend": {"/health", "/metrics"}}
DEFAULT_PORTS = {"gateway": 8080, "backend": 8000}


# --- helpers ---------------------------------------------------------------------------------

def all_yaml() -> list[Path]:
    return sorted(p for p in DEPLOY.rglob("*") if p.suffix in (".yaml", ".yml"))


def load(path: Path) -> list:
    return [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d is not None]


_FLAG_CACHE: dict[str, set[str]] = {}


def real_flags(module: str) -> set[str]:
    """Long options the module's real argparse parser accepts (from --help)."""
    if module not in _FLAG_CACHE:
        proc = subprocess.run([sys.executable, "-m", module, "--help"], cwd=ROOT,
                              capture_output=True, text=True, timeout=60)
        flags = set(re.findall(r"(--[a-z][a-z0-9-]*)", proc.stdout)) if proc.returncode == 0 \
            else set()
        _FLAG_CACHE[module] = flags or FALLBACK_FLAGS[module]
    return _FLAG_CACHE[module]


def check_command(argv: list[str]) -> tuple[str, dict[str, str]]:
    """argv = python -m MODULE [--flag value]...; asserts every flag exists; returns options."""
    assert argv[:2] == ["python", "-m"] and argv[2] in ("gateway", "backend"), argv
    module, opts, rest = argv[2], {}, argv[3:]
    allowed = real_flags(module)
    i = 0
    while i < len(rest):
        flag = rest[i]
        assert flag in allowed, f"python -m {module} has no flag {flag} (has {sorted(allowed)})"
        if i + 1 < len(rest) and not rest[i + 1].startswith("--"):
            opts[flag] = rest[i + 1]
            i += 2
        else:
            opts[flag] = ""
            i += 1
    return module, opts


def listen_port(module: str, opts: dict[str, str]) -> int:
    return int(opts.get("--port", DEFAULT_PORTS[module]))


# --- parsing ---------------------------------------------------------------------------------

def test_every_yaml_and_json_under_deploy_parses():
    files = all_yaml()
    assert len(files) >= 10, files
    for path in files:
        assert load(path), f"{path} is empty"
    jsons = sorted(DEPLOY.rglob("*.json"))
    assert jsons
    for path in jsons:
        json.loads(path.read_text(encoding="utf-8"))


def test_container_gateway_config_loads_with_the_real_loader():
    gw = pytest.importorskip("gateway.config")
    path = DEPLOY / "gateway.container.yaml"
    cfg = gw.load_config(path, env={})
    assert cfg.listen.host == "0.0.0.0"
    assert cfg.providers["local"].base_url == "http://backend:8000/v1"
    k8s_url = "http://firsttoken-backend:8000/v1"
    cfg = gw.load_config(path, env={"BACKEND_BASE_URL": k8s_url})
    assert cfg.providers["local"].base_url == k8s_url
    # Same aliases, providers and key names as the default config: only the network differs.
    default = gw.load_config(ROOT / "configs" / "gateway.yaml", env={})
    assert set(cfg.models) == set(default.models)
    assert set(cfg.providers) == set(default.providers)
    assert [k.env for k in cfg.keys] == [k.env for k in default.keys]
    assert cfg.providers["taotoken"].api_key_env == "TAOTOKEN_API_KEY"


# --- compose ---------------------------------------------------------------------------------

def compose() -> dict:
    (doc,) = load(DEPLOY / "compose.yaml")
    return doc


def test_compose_commands_ports_healthchecks():
    services = compose()["services"]
    assert set(services) == {"backend", "gateway", "prometheus", "grafana"}
    for name in ("backend", "gateway"):
        svc = services[name]
        module, opts = check_command(svc["command"])
        assert module == name
        port = listen_port(module, opts)
        assert opts.get("--host") == "0.0.0.0"  # reachable from the compose network
        assert svc["ports"] == [f"127.0.0.1:{port}:{port}"]
        probe = " ".join(svc["healthcheck"]["test"])
        url = re.search(r"http://127\.0\.0\.1:(\d+)(/\S*?)['\"]", probe)
        assert url and int(url.group(1)) == port and url.group(2) in HEALTH_PATHS[name], probe
    gw_cfg = services["gateway"]["command"][services["gateway"]["command"].index("--config") + 1]
    assert (ROOT / gw_cfg).is_file()
    assert services["gateway"]["depends_on"]["backend"]["condition"] == "service_healthy"


def test_compose_binds_every_port_to_loopback_and_keys_come_from_env():
    services = compose()["services"]
    for name, svc in services.items():
        for mapping in svc.get("ports", []):
            assert mapping.startswith("127.0.0.1:"), f"{name} publishes {mapping} beyond loopback"
        assert "healthcheck" in svc, name
    env = services["gateway"]["environment"]
    assert "GATEWAY_API_KEY=${GATEWAY_API_KEY:?export GATEWAY_API_KEY (the key clients send)}" in env
    assert "TAOTOKEN_API_KEY" in env  # passed through, never a value in the file
    assert "BACKEND_BASE_URL=http://backend:8000/v1" in env
    lines = [ln for ln in (DEPLOY / "compose.yaml").read_text().splitlines()
             if not ln.lstrip().startswith("#")]
    for ln in lines:
        assert not re.search(r"(API_KEY|PASSWORD)=(?!\$\{)", ln), f"a secret literal: {ln}"


def test_compose_mounts_exist():
    services = compose()["services"]
    for name in ("prometheus", "grafana"):
        for vol in services[name]["volumes"]:
            src = vol.split(":")[0]
            if src.startswith("./"):
                assert (DEPLOY / src).exists(), f"{name} mounts missing {src}"
    prom = (DEPLOY / "prometheus" / "prometheus.yml").read_text()
    targets = re.findall(r'"(gateway|backend):(\d+)"', prom)
    assert sorted(targets) == [("backend", "8000"), ("gateway", "8080")]


# --- Dockerfile ------------------------------------------------------------------------------

def test_dockerfile_copies_existing_paths_and_runs_a_real_command():
    text = (DEPLOY / "Dockerfile").read_text()
    assert re.search(r"^ARG PYTHON_IMAGE=python:3\.11-slim$", text, re.M)
    assert "--index-url \"${TORCH_INDEX_URL}\"" in text
    assert "TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu" in text
    for src in re.findall(r"^COPY (\S+) ", text, re.M):
        assert (ROOT / src).exists(), f"COPY {src}: no such path in the repo"
    assert "python -m backend.weights.embedded --dir" in text
    cmd = json.loads(re.search(r"^CMD (\[.*\])$", text, re.M).group(1))
    module, opts = check_command(cmd)
    assert (ROOT / opts["--config"]).is_file()
    assert f"EXPOSE {listen_port(module, opts)}" in text


# --- Kubernetes ------------------------------------------------------------------------------

def k8s_objects() -> dict[tuple[str, str], dict]:
    out = {}
    for path in sorted((DEPLOY / "k8s").glob("*.yaml")):
        for doc in load(path):
            out[(doc["kind"], doc.get("metadata", {}).get("name", path.stem))] = doc
    return out


def test_k8s_kustomization_lists_every_manifest():
    (kust,) = load(DEPLOY / "k8s" / "kustomization.yaml")
    files = {p.name for p in (DEPLOY / "k8s").glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kust["resources"]) == files


@pytest.mark.parametrize("name", ["backend", "gateway"])
def test_k8s_deployment_commands_probes_services(name):
    objs = k8s_objects()
    dep = objs[("Deployment", f"firsttoken-{name}")]
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    module, opts = check_command(c["command"] + c["args"])
    assert module == name
    port = listen_port(module, opts)
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"http": port}
    for probe in ("readinessProbe", "livenessProbe"):
        get = c[probe]["httpGet"]
        assert get["port"] == "http" and get["path"] in HEALTH_PATHS[name], (probe, get)
    ann = dep["spec"]["template"]["metadata"]["annotations"]
    assert ann["prometheus.io/port"] == str(port) and ann["prometheus.io/path"] == "/metrics"
    svc = objs[("Service", f"firsttoken-{name}")]
    assert svc["spec"]["selector"] == dep["spec"]["selector"]["matchLabels"]
    assert svc["spec"]["ports"][0]["targetPort"] == "http"


def test_k8s_backend_asks_for_a_gpu_and_reads_health():
    dep = k8s_objects()[("Deployment", "firsttoken-backend")]
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert c["args"][c["args"].index("--device") + 1] == "cuda"
    assert c["readinessProbe"]["httpGet"]["path"] == "/health"


def test_k8s_gateway_config_and_secrets():
    objs = k8s_objects()
    cm = objs[("ConfigMap", "firsttoken-gateway-config")]
    # The ConfigMap carries deploy/gateway.container.yaml verbatim.
    assert cm["data"]["gateway.yaml"] == (DEPLOY / "gateway.container.yaml").read_text()
    dep = objs[("Deployment", "firsttoken-gateway")]
    spec = dep["spec"]["template"]["spec"]
    (c,) = spec["containers"]
    mount = next(m for m in c["volumeMounts"] if m["name"] == "config")
    assert c["args"][c["args"].index("--config") + 1] == f"{mount['mountPath']}/gateway.yaml"
    vol = next(v for v in spec["volumes"] if v["name"] == "config")
    assert vol["configMap"]["name"] == "firsttoken-gateway-config"
    env = {e["name"]: e for e in c["env"]}
    for key in ("GATEWAY_API_KEY", "TAOTOKEN_API_KEY"):
        assert "value" not in env[key], f"{key} must come from a Secret"
        assert env[key]["valueFrom"]["secretKeyRef"]["name"] == "firsttoken-keys"
    assert env["TAOTOKEN_API_KEY"]["valueFrom"]["secretKeyRef"]["optional"] is True
    backend_svc = objs[("Service", "firsttoken-backend")]
    assert env["BACKEND_BASE_URL"]["value"] == \
        f"http://firsttoken-backend:{backend_svc['spec']['ports'][0]['port']}/v1"
    sm = objs[("ServiceMonitor", "firsttoken")]
    assert sm["spec"]["endpoints"][0] == {"port": "http", "path": "/metrics", "interval": "5s"}
