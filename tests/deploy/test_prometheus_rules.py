"""The shipped Prometheus config and rules through Prometheus's own promtool (Debian's
`prometheus` package, tests/system-packages.txt): check config, check rules, and the alert unit
tests in tests/deploy/promtool/ (the TTFT SLO burn alert fires on a sustained burn, not on a blip).
"""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.deploy.promql_exprs import DEPLOY, PROMETHEUS_YML, ROOT, rule_files

UNIT_TESTS = sorted((ROOT / "tests" / "deploy" / "promtool").glob("*_test.yml"))


def binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is missing: bash tests/system-packages.sh installs it "
                    "(`make test` does)")
    return path


def promtool(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([binary("promtool"), *args], cwd=cwd, capture_output=True, text=True,
                          timeout=60)


def test_shipped_config_checks_with_its_rule_files():
    res = promtool("check", "config", str(PROMETHEUS_YML))
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"SUCCESS: {len(rule_files())} rule files found" in res.stdout + res.stderr


def test_shipped_rule_files_check():
    files = rule_files()
    assert {f.name for f in files} >= {"alerts.yml", "recording.yml"}
    res = promtool("check", "rules", *map(str, files))
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.mark.parametrize("unit", UNIT_TESTS, ids=lambda p: p.name)
def test_alert_unit_tests_pass(unit):
    res = promtool("test", "rules", str(unit))
    assert res.returncode == 0, res.stdout + res.stderr


def test_the_unit_tests_catch_a_burn_alert_that_fires_on_a_blip(tmp_path):
    """The same unit tests against alerts whose 1-hour threshold is lowered from 14.4 to 1.4:
    the 3-minute blip then pages, and promtool must say so."""
    (tmp_path / "deploy" / "prometheus").mkdir(parents=True)
    (tmp_path / "tests" / "deploy" / "promtool").mkdir(parents=True)
    alerts = (DEPLOY / "prometheus" / "alerts.yml").read_text()
    assert "burn_rate1h > 14.4" in alerts
    (tmp_path / "deploy" / "prometheus" / "alerts.yml").write_text(
        alerts.replace("burn_rate1h > 14.4", "burn_rate1h > 1.4"))
    shutil.copy(DEPLOY / "prometheus" / "recording.yml", tmp_path / "deploy" / "prometheus")
    unit = tmp_path / "tests" / "deploy" / "promtool" / "ttft_slo_test.yml"
    shutil.copy(ROOT / "tests" / "deploy" / "promtool" / "ttft_slo_test.yml", unit)
    res = promtool("test", "rules", str(unit))
    assert res.returncode != 0
    assert 'model="blip"' in res.stdout + res.stderr
