"""The Grafana dashboard and the Prometheus rules under deploy/ name only metrics and labels the code exports.

Every PromQL expression of ``deploy/grafana/zcluster.json`` (panel targets, template queries) and of
``deploy/prometheus/zcluster-rules.yml`` is read for its metric names and label names; the metrics are
really exported into a CollectorRegistry by running the code on real servers (cluster calls through
PrometheusInstrumentation, a shard that fails, a call that raises, a Consumer's polls through ApplierMetrics,
the ProgressCollector over its checkpoints) and each name and label is looked up there.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("prometheus_client")
pytest.importorskip("yaml")
import yaml
from prometheus_client import CollectorRegistry

from zcluster import Cluster, InvalidTupleError, KeyScoreMember
from zcluster.journal import FileJournals
from zcluster.metrics import ApplierMetrics, ProgressCollector, PrometheusInstrumentation
from zcluster.state import Consumer
from zcluster.testing import LocalShards, closed_port
from zcluster.testing.traffic import Traffic, create_journals, publish, timeline_mapper

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"
DASHBOARD = DEPLOY / "grafana" / "zcluster.json"
RULES = DEPLOY / "prometheus" / "zcluster-rules.yml"

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')
_SELECTOR = re.compile(r"([A-Za-z_:][\w:]*)?\s*\{([^}]*)\}")
_MATCHER = re.compile(r"([A-Za-z_]\w*)\s*(?:=~|!~|!=|=)")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")
_IDENT = re.compile(r"(?<![\w.$])([A-Za-z_:][\w:]*)(?![\w:]|\s*\()")
_KEYWORDS = {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring", "group_left", "group_right"}
_LABEL_VALUES = re.compile(r"^label_values\(\s*([A-Za-z_:][\w:]*)\s*,\s*(\w+)\s*\)$")


def promql_uses(expr: str) -> tuple[dict[str, set[str]], set[str]]:
    """The metrics ``expr`` names, each with the labels its selectors match on, and the labels of its
    grouping clauses (by, without, on, ignoring, group_left/right), which any of its metrics may carry.
    Grafana's ``label_values(metric, label)`` counts as the metric with that label."""
    found = _LABEL_VALUES.match(expr.strip())
    if found:
        return {found.group(1): {found.group(2)}}, set()
    metrics: dict[str, set[str]] = {}
    # Label values are strings: blank them first (their text is no name), keeping the quotes for the matchers.
    text = _STRING.sub('""', expr)
    for name, matchers in _SELECTOR.findall(text):
        assert name, f"a selector without a metric name in {expr!r}"
        metrics.setdefault(name, set()).update(_MATCHER.findall(matchers))
    grouping = {label.strip() for labels in _GROUPING.findall(text) for label in labels.split(",") if label.strip()}
    rest = _GROUPING.sub(" ", _SELECTOR.sub(lambda m: f" {m.group(1)} ", text))
    rest = re.sub(r"\[[^\]]*\]", " ", rest)  # ranges and subqueries: [5m], [$__rate_interval]
    rest = re.sub(r"\boffset\s+\S+", " ", rest)
    for name in _IDENT.findall(rest):
        if name not in _KEYWORDS and not re.fullmatch(r"(?i)inf|nan", name):
            metrics.setdefault(name, set())
    return metrics, grouping


def dashboard_exprs() -> list[str]:
    doc = json.loads(DASHBOARD.read_text())
    exprs: list[str] = []

    def panels(items: list[dict[str, object]]) -> Iterator[dict[str, object]]:
        for panel in items:
            yield panel
            yield from panels(panel.get("panels", []))  # type: ignore[arg-type]

    for panel in panels(doc["panels"]):
        exprs.extend(t["expr"] for t in panel.get("targets", []))  # type: ignore[attr-defined]
    for var in doc["templating"]["list"]:
        if var["type"] == "query":
            query = var["query"]
            exprs.append(query["query"] if isinstance(query, dict) else query)
    return exprs


def rule_exprs() -> list[str]:
    doc = yaml.safe_load(RULES.read_text())
    return [rule["expr"] for group in doc["groups"] for rule in group["rules"]]


def problems(exprs: list[str], exported: dict[str, set[str]]) -> list[str]:
    """What the expressions use that ``exported`` (sample name -> its label names) does not hold."""
    out = []
    for expr in exprs:
        metrics, grouping = promql_uses(expr)
        assert metrics, f"no metric found in {expr!r}"
        carried: set[str] = set()
        for name, labels in metrics.items():
            if name not in exported:
                out.append(f"{name}: no such metric (in {expr!r})")
                continue
            carried |= exported[name]
            out.extend(f"{name}: no label {label} (in {expr!r})" for label in sorted(labels - exported[name]))
        out.extend(f"no metric of {expr!r} carries label {label}" for label in sorted(grouping - carried))
    return out


@pytest.fixture(scope="module")
def exported(shards: LocalShards, tmp_path_factory: pytest.TempPathFactory) -> dict[str, set[str]]:
    """Sample names and their label names, from a registry fed by the code on real servers."""
    registry = CollectorRegistry()
    hook = PrometheusInstrumentation(registry)
    prefix = f"dm{uuid.uuid4().hex[:8]}:"
    failing = CollectorRegistry()  # the progress of a cluster with a shard down (its own: the same names)
    with (
        closed_port() as dead,
        Cluster.from_urls([shards.urls[0], f"redis://127.0.0.1:{dead}"], prefix=prefix, instrumentation=hook) as broken,
    ):
        assert broken.insert([KeyScoreMember(f"k{i}", 1.0, "m") for i in range(10)], raise_on_error=False).failures
        with pytest.raises(InvalidTupleError):
            broken.insert([KeyScoreMember("", 1.0, "m")])  # raises before any shard answered
        failing.register(ProgressCollector(broken))
        scraped = list(failing.collect())
    root = tmp_path_factory.mktemp("deploy") / "journals"
    store = FileJournals(root)
    create_journals(store, ["a", "b"])
    publish(store, Traffic(["a", "b"]), producers=2, messages=40, seed=5)
    with Cluster.from_urls(shards.urls, prefix=f"dm{uuid.uuid4().hex[:8]}:", instrumentation=hook) as cluster:
        Consumer(cluster, store, timeline_mapper, "deployapp", metrics=ApplierMetrics(registry)).poll()
        registry.register(ProgressCollector(cluster, store))
        out: dict[str, set[str]] = {}
        for family in [*registry.collect(), *scraped]:
            for sample in family.samples:
                out.setdefault(sample.name, set()).update(sample.labels)
    assert "zcluster_consumer_lag_bytes" in out and "zcluster_shard_errors_total" in out
    return out


def test_promql_uses_finds_metrics_and_labels() -> None:
    metrics, grouping = promql_uses(
        'histogram_quantile(0.99, sum by (app, le) (rate(x_bucket{app=~"$app", op!="a b"}[$__rate_interval])))'
        " > 1e8 and on (app) y offset 5m"
    )
    assert metrics == {"x_bucket": {"app", "op"}, "y": set()} and grouping == {"app", "le"}
    assert promql_uses("label_values(z_total, app)") == ({"z_total": {"app"}}, set())


def test_the_dashboard_and_the_rules_use_only_exported_metrics_and_labels(exported: dict[str, set[str]]) -> None:
    exprs = dashboard_exprs() + rule_exprs()
    assert len(dashboard_exprs()) > 10 and len(rule_exprs()) >= 5
    assert problems(exprs, exported) == []
    # The check can fail: a metric that does not exist, a label a metric does not carry, a grouping label.
    assert problems(["rate(zcluster_no_such_total[5m])"], exported) == [
        "zcluster_no_such_total: no such metric (in 'rate(zcluster_no_such_total[5m])')"
    ]
    assert problems(['zcluster_consumer_lag_bytes{shard="x"}'], exported)
    assert problems(["sum by (shard) (zcluster_applier_delivered_total)"], exported)
