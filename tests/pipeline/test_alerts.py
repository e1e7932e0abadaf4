"""Alert kinds and severity: pages fail the nightly run, warnings complete it; the headline names the worst. An alert
is a typed value: its kind decides, never its words."""

from __future__ import annotations

import pickle
import re
from pathlib import Path

import numpy as np
import polars as pl

from cic.pipeline import alerts
from cic.pipeline.alerts import Alert, AlertKind

DRIFT = Alert(alerts.ERROR_RATE, "error rate at the live threshold 0.653 is 137/309 = 0.443: above the certified "
                                 "alpha = 0.2 (p = 1e-9)")
ALARM = Alert(alerts.MONITOR_ALARM, "anytime-valid monitor of live gate abc (m · dataset d · se, α=0.2): error rate "
                                    "among answered above α")
UNREACHABLE = Alert(alerts.UNATTAINABLE, "alpha is unattainable on the new window (300 labelled questions): the gate "
                                         "would abstain on everything")
BECAME = Alert(alerts.BECAME_UNATTAINABLE, "alpha has become unattainable: the new gate would abstain on everything")


def test_drift_alarms_and_a_lost_live_alpha_page_an_alpha_never_reached_warns() -> None:
    assert [alerts.severity(t) for t in (DRIFT, ALARM, BECAME, UNREACHABLE)] == ["page", "page", "page", "warning"]
    assert alerts.kind_of(ALARM).name == "monitor alarm"
    assert alerts.severity("a sentence stored before kinds were") == "page"  # an unknown alert is not silenced


def test_the_kind_decides_not_the_words() -> None:
    """The same sentence under another kind is classified by its kind: no text prefix decides anything."""
    worded_like_drift = Alert(alerts.UNATTAINABLE, str(DRIFT))
    assert alerts.severity(worded_like_drift) == "warning" and not alerts.withdraws(worded_like_drift)
    assert alerts.withdraws(DRIFT) and alerts.withdraws(ALARM) and not alerts.withdraws(BECAME)
    reworded = Alert(alerts.ERROR_RATE, "the answered questions' error rate went over alpha")
    assert alerts.severity(reworded) == "page" and alerts.withdraws(reworded)


def test_a_new_alert_kind_is_one_registry_entry() -> None:
    """Registering a kind is all it takes: severity, counts, the headline and the stored round trip follow."""
    kinds = alerts.ALERT_KINDS.copy()
    late = kinds.register(AlertKind("labels arrived out of order", alerts.WARNING, 16))
    alert = Alert(late, "12 labels of night 3 arrived after night 5's")
    assert alerts.severity(alert) == "warning" and alerts.counts_line([alert, alert]) == \
        "labels arrived out of order × 2"
    assert alerts.headline([("m/d", alert), ("m/d", DRIFT)]).startswith("PAGE m/d: error rate at")
    alerts.ALERT_KINDS.register(late)
    try:
        back = alerts.stored([str(alert)], alerts.kind_names([alert]))
        assert alerts.kind_of(back[0]) is late
    finally:
        alerts.ALERT_KINDS._entries.pop("labels arrived out of order")


def test_an_alert_keeps_its_kind_through_pickling_and_the_event_log(tmp_path: Path) -> None:
    """Ray and Prefect pickle results; the store keeps each alert's kind beside its sentence."""
    from cic.pipeline.gates.lifecycle import current_states, find_gate, flag_gates
    from cic.store import Store
    from tests.pipeline.test_recalibration import make_live, only_group
    from tests.support.pipeline_data import store_run

    assert alerts.kind_of(pickle.loads(pickle.dumps(ALARM))) is alerts.MONITOR_ALARM
    with Store.open(tmp_path / "a.duckdb") as store:
        store_run(store, n=300, estimators=("semantic_entropy",))
        gate_id = make_live(store, only_group(store))["calibration_id"][0]
        flag_gates(store, {gate_id: DRIFT})
        flag_gates(store, {gate_id: ALARM})
        row = current_states(store).filter(pl.col("calibration_id") == gate_id).row(0, named=True)
        assert row["alert_kinds"] == ["error rate above alpha", "monitor alarm"]
        kinds = [alerts.kind_of(a) for a in find_gate(store, gate_id).alerts]
        assert kinds == [alerts.ERROR_RATE, alerts.MONITOR_ALARM]


def test_the_headline_names_the_worst_alert_first_and_counts_the_rest_in_one_line() -> None:
    placed = [(f"m/d se α={a} cp geometric", UNREACHABLE) for a in (0.05, 0.1)] * 4 + [("m/d se α=0.2", DRIFT),
                                                                                        ("m/d se α=0.2", ALARM)]
    line = alerts.headline(placed)
    assert line.startswith(f"PAGE m/d se α=0.2: {DRIFT}")
    assert line.endswith("— 9 more: monitor alarm × 1, alpha unattainable × 8") and "\n" not in line
    assert alerts.headline([("x", UNREACHABLE)]).startswith("WARNING x: alpha is unattainable")


def test_no_decision_reads_an_alert_sentence() -> None:
    """No `startswith` on an alert's text anywhere in the package, flows or tasks."""
    root = Path(__file__).resolve().parents[2]
    offenders = [f"{path.relative_to(root)}:{n}" for folder in ("cic", "flows", "tasks")
                 for path in (root / folder).rglob("*.py")
                 for n, line in enumerate(path.read_text().splitlines(), 1)
                 if re.search(r"(alert\w*|\ba|\bwhy|headline\(.*\))\)?\.startswith\(", line)]
    assert offenders == []


def test_every_drift_test_raises_an_alert_of_its_kind() -> None:
    from cic.pipeline.production.windows import Check
    from cic.stats.drift import answered_error_test, error_rate_test, score_shift_test

    made = [score_shift_test(np.arange(10.0), np.arange(10.0) + 5),
            error_rate_test(np.arange(10.0), np.ones(10), threshold=5.0, alpha=0.1),
            answered_error_test(np.ones(10, bool), np.ones(10), alpha=0.1, where="x")]
    kinds = [alerts.kind_of(Check(test, []).alert()) for test in made]
    assert kinds == [alerts.SCORE_SHIFT, alerts.ERROR_RATE, alerts.ERROR_RATE]


def test_a_new_drift_kind_gets_its_mlflow_metrics_from_its_registry_entry_alone() -> None:
    """A kind naming its drift test (`AlertKind.test`) is what its rejection raises, and the recalibration run logs
    its count and the test's statistic and p-value — no edit of the logging code (cic.services.mlflow_layout)."""
    from cic.pipeline.production.windows import Check
    from cic.services.mlflow_layout import alert_metrics
    from cic.stats.drift import DriftTest, score_shift_test

    kind = AlertKind("length shift", alerts.WARNING, 17, test="length_shift")
    assert kind.metric == "alerts_length_shift" and alerts.SCORE_SHIFT.metric == "alerts_score_shift"
    alerts.ALERT_KINDS.register(kind)
    try:
        tests = [DriftTest("length_shift", 0.4, 0.002, 50, 60, "answers got longer"),
                 DriftTest("length_shift", 0.1, 0.3, 50, 60, "answers of another slot"),
                 score_shift_test(np.arange(10.0), np.arange(10.0) + 5)]
        checks = [Check(t, [], rejected=t.p_value < 0.01) for t in tests]
        raised = [c.alert() for c in checks if c.rejected]
        assert [alerts.kind_of(a) for a in raised] == [kind]
        metrics = alert_metrics([*raised, DRIFT], alarms=2, checks=checks)
        assert metrics["alerts_length_shift"] == 1 and metrics["alerts_error_rate_above_alpha"] == 1
        assert metrics["alerts_monitor_alarm"] == 2 and metrics["alerts_alpha_unattainable"] == 0
        assert metrics["length_shift_statistic"] == 0.4 and metrics["length_shift_p_value"] == 0.002
        assert metrics["ks_p_value"] == metrics["score_shift_p_value"] == tests[2].p_value
        assert sum(v for k, v in metrics.items() if k.startswith("alerts_")) == 1 + 1 + 2
    finally:
        alerts.ALERT_KINDS.unregister("length shift")
    assert alerts.kind_of(Check(tests[0], []).alert()) is alerts.UNCLASSIFIED  # a test no kind names still pages
