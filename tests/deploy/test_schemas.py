"""The deploy files against the real specifications, offline: every Kubernetes object in deploy/k8s
against the Kubernetes OpenAPI schemas (kubernetes-validate, strict: unknown fields fail), the
compose file against the Compose Specification's JSON schema (check-jsonschema's vendored copy).
"""
from __future__ import annotations

import copy
import subprocess
import sys

import pytest
import yaml

from tests.deploy.test_assets import DEPLOY, load

kv = pytest.importorskip("kubernetes_validate")
pytest.importorskip("check_jsonschema")

# The oldest Kubernetes minor still common in managed clusters, and the newest the package knows.
K8S_VERSIONS = ("1.29", kv.utils.latest_version())
# Objects with no schema in the Kubernetes API, each with the reason.
NOT_KUBERNETES_API = {
    "Kustomization": "kustomize's own file (kubectl apply -k reads it), not an API object",
    "ServiceMonitor": "a Prometheus Operator custom resource: its schema ships with the Operator",
}
COMPOSE = DEPLOY / "compose.yaml"


def k8s_docs() -> list[dict]:
    return [doc for path in sorted((DEPLOY / "k8s").glob("*.yaml")) for doc in load(path)]


def test_every_kind_is_validated_or_named_as_a_custom_resource():
    kinds = {doc["kind"] for doc in k8s_docs()}
    assert {"Deployment", "Service", "ConfigMap"} <= kinds
    assert set(NOT_KUBERNETES_API) <= kinds  # no stale entry


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_k8s_objects_are_valid_kubernetes(version):
    checked = 0
    for doc in k8s_docs():
        if doc["kind"] in NOT_KUBERNETES_API:
            with pytest.raises(kv.SchemaNotFoundError):  # still no schema for it: the reason holds
                kv.validate(doc, version, strict=True)
            continue
        kv.validate(doc, version, strict=True)  # raises ValidationError with the path
        checked += 1
    assert checked >= 5


@pytest.mark.parametrize("mutate", [
    lambda c: c.__setitem__("readynessProbe", c.pop("readinessProbe")),      # unknown field
    lambda c: c["ports"][0].__setitem__("containerPort", "eight thousand"),  # wrong type
    lambda c: c["resources"].__setitem__("limit", c["resources"].pop("limits")),
])
def test_the_k8s_check_catches_a_broken_manifest(mutate):
    (dep,) = [d for d in k8s_docs() if d["kind"] == "Deployment"
              and d["metadata"]["name"] == "firsttoken-backend"]
    dep = copy.deepcopy(dep)
    mutate(dep["spec"]["template"]["spec"]["containers"][0])
    with pytest.raises(kv.ValidationError):
        kv.validate(dep, K8S_VERSIONS[-1], strict=True)


def check_compose(path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "check_jsonschema", "--builtin-schema",
                           "vendor.compose-spec", str(path)], capture_output=True, text=True,
                          timeout=60)


def test_compose_file_is_valid_compose():
    res = check_compose(COMPOSE)
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.mark.parametrize("mutate", [
    lambda d: d["services"]["backend"]["healthcheck"].__setitem__("intervall", "10s"),
    lambda d: d["services"]["gateway"].__setitem__("depends_on", {"backend": {"condition": 1}}),
    lambda d: d["services"]["prometheus"].__setitem__("ports", "127.0.0.1:9090:9090"),
])
def test_the_compose_check_catches_a_broken_file(tmp_path, mutate):
    doc = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))
    mutate(doc)
    bad = tmp_path / "compose.yaml"
    bad.write_text(yaml.safe_dump(doc))
    res = check_compose(bad)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "Schema validation errors" in res.stdout + res.stderr
