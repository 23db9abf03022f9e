"""Every PromQL expression the deploy files ship, and a checker that runs them on a real Prometheus.

Collection is generic: every ``expr`` anywhere in the Grafana dashboard JSON (panels, collapsed
rows, whatever is added later), every templating query, and every rule of every rule file that
deploy/prometheus/prometheus.yml loads. Grafana's variables are replaced by what Grafana sends
for the default selection ("All" = ``.*``, intervals = 1m).

The checker (``check``) asks a live Prometheus, for each expression:
  - that it parses and evaluates (the query API answers ``success``);
  - that each part that carries data returns at least one series with a finite value: a
    comparison against a number (``x > 1``, an alert's threshold) is a filter, so its vector side
    is checked instead, and both sides of ``and``/``or``/``unless`` are checked on their own;
  - that each label it names exists on the series it names it on: matchers
    (``{model=~".*"}`` matches everything when the label does not exist), ``by (...)`` groupings
    and ``on (...)`` joins. A typo in a metric or a label name therefore fails.
"""
from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any, Callable, Iterator

import promql_parser as pp
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
PROMETHEUS_YML = DEPLOY / "prometheus" / "prometheus.yml"
DASHBOARDS = DEPLOY / "grafana" / "dashboards"

_COMPARISONS = {">", "<", ">=", "<=", "==", "!="}
_SET_OPS = {"and", "or", "unless"}
# Grafana's interval variables; any other $variable is a label selector whose default is "All".
_INTERVAL_VAR = re.compile(r"\$(?:\{__\w+\}|__\w+)")
_LABEL_VAR = re.compile(r"\$(?:\{\w+(?::\w+)?\}|\w+)")
_LABEL_VALUES = re.compile(r"^\s*label_values\(\s*(.+?)\s*,\s*\w+\s*\)\s*$", re.S)
_QUERY_RESULT = re.compile(r"^\s*query_result\(\s*(.+)\s*\)\s*$", re.S)

Query = Callable[[str], list[dict]]  # PromQL -> the "result" list of an instant query


def rule_files() -> list[Path]:
    """The rule files prometheus.yml loads (relative paths resolve against its folder)."""
    cfg = yaml.safe_load(PROMETHEUS_YML.read_text(encoding="utf-8"))
    return [(PROMETHEUS_YML.parent / f).resolve() for f in cfg.get("rule_files", [])]


def rule_exprs() -> list[str]:
    out = []
    for path in rule_files():
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
        out += [r["expr"] for g in doc["groups"] for r in g["rules"]]
    return out


def recorded_names() -> set[str]:
    names = set()
    for path in rule_files():
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
        names |= {r["record"] for g in doc["groups"] for r in g["rules"] if "record" in r}
    return names


def _walk_json(node: Any) -> Iterator[tuple[str, Any]]:
    if isinstance(node, dict):
        for k, v in node.items():
            yield k, v
            yield from _walk_json(v)
    elif isinstance(node, list):
        for v in node:
            yield from _walk_json(v)


def dashboard_exprs() -> list[str]:
    """Panel targets anywhere in each dashboard, and the queries of its query variables."""
    out = []
    for path in sorted(DASHBOARDS.glob("*.json")):
        doc = json.loads(path.read_text(encoding="utf-8"))
        out += [v for k, v in _walk_json(doc.get("panels", [])) if k == "expr" and v]
        for var in doc.get("templating", {}).get("list", []):
            if var.get("type") != "query":
                continue
            q = var.get("query")
            text = q.get("query", "") if isinstance(q, dict) else (q or var.get("definition", ""))
            m = _LABEL_VALUES.match(text) or _QUERY_RESULT.match(text)
            if m:  # label_values(label) alone names no series: nothing to check
                out.append(m.group(1))
    return out


def as_promql(expr: str) -> str:
    """What Prometheus receives from Grafana with the default selections."""
    return _LABEL_VAR.sub(".*", _INTERVAL_VAR.sub("1m", expr))


def text(node: Any) -> str:
    """The parser's rendering of a node, without the empty ``{}`` it adds to bare names."""
    return re.sub(r"([\w:])\{\}", r"\1", str(node))


def _children(node: Any) -> list[Any]:
    if isinstance(node, pp.BinaryExpr):
        return [node.lhs, node.rhs]
    if isinstance(node, pp.Call):
        return list(node.args)
    if isinstance(node, pp.MatrixSelector):
        return [node.vector_selector]
    if isinstance(node, (pp.AggregateExpr, pp.ParenExpr, pp.UnaryExpr, pp.SubqueryExpr)):
        return [node.expr] + ([node.param] if getattr(node, "param", None) is not None else [])
    return []


def _nodes(node: Any) -> Iterator[Any]:
    yield node
    for c in _children(node):
        yield from _nodes(c)


def data_parts(node: Any) -> list[Any]:
    """The sub-expressions that must return data: thresholds and set operators are peeled."""
    if isinstance(node, pp.ParenExpr):
        return data_parts(node.expr)
    if isinstance(node, pp.BinaryExpr):
        op = str(node.op)
        filtering = op in _COMPARISONS and not (node.modifier and node.modifier.return_bool)
        if op in _SET_OPS or filtering:
            sides = [s for s in (node.lhs, node.rhs) if not isinstance(s, pp.NumberLiteral)]
            return [p for s in sides for p in data_parts(s)]
    return [node]


def label_checks(node: Any) -> list[tuple[str, str]]:
    """(label, PromQL whose series must carry that label) for every label the expression names."""
    out = []
    for n in _nodes(node):
        if isinstance(n, pp.VectorSelector) and n.name:
            for m in n.matchers.matchers:
                if m.name != "__name__":
                    out.append((m.name, n.name))
        elif isinstance(n, pp.AggregateExpr) and n.modifier is not None \
                and str(n.modifier.type).endswith("By"):
            out += [(label, text(n.expr)) for label in n.modifier.labels]
        elif isinstance(n, pp.BinaryExpr) and n.modifier is not None \
                and n.modifier.matching is not None \
                and str(n.modifier.matching.type).endswith("On"):
            out += [(label, text(side)) for label in n.modifier.matching.labels
                    for side in (n.lhs, n.rhs) if not isinstance(side, pp.NumberLiteral)]
    return out


def _finite(result: list[dict]) -> bool:
    return any(math.isfinite(float(r["value"][1])) for r in result)


def check(expr: str, query: Query, no_data_ok: set[str] = frozenset()) -> list[str]:
    """Problems found in one shipped expression (an empty list: it is fine)."""
    promql = as_promql(expr)
    try:
        tree = pp.parse(promql)
        query(promql)
    except Exception as e:  # noqa: BLE001 - a parse or an evaluation error is the finding
        return [f"{promql!r} does not evaluate: {e}"]
    problems = []
    for part in data_parts(tree):
        sub = text(part)
        if sub not in no_data_ok and not _finite(query(sub)):
            problems.append(f"{sub!r} (in {promql!r}) returned no series with a finite value")
    for label, sub in label_checks(tree):
        rows = query(f"count by ({label}) ({sub})")
        if not any(label in r["metric"] for r in rows) and sub not in no_data_ok:
            problems.append(f"label {label!r} is on no series of {sub!r} (in {promql!r})")
    return problems
