"""Alert kinds and severity: pages fail the nightly run, warnings complete it; the headline names the worst."""

from __future__ import annotations

from cic.pipeline import alerts

DRIFT = "error rate at the live threshold 0.653 is 137/309 = 0.443: above the certified alpha = 0.2 (p = 1e-9)"
ALARM = "anytime-valid monitor of live gate abc (m · dataset d · se, α=0.2): error rate among answered above α"
UNREACHABLE = "alpha is unattainable on the new window (300 labelled questions): the gate would abstain on everything"
BECAME = "alpha has become unattainable: the new gate would abstain on everything"


def test_drift_alarms_and_a_lost_live_alpha_page_an_alpha_never_reached_warns() -> None:
    assert [alerts.severity(t) for t in (DRIFT, ALARM, BECAME, UNREACHABLE)] == ["page", "page", "page", "warning"]
    assert alerts.alert_kind(ALARM)[1] == "monitor alarm"  # not "other"
    assert alerts.severity("something nobody anticipated") == "page"  # an unknown alert is not silenced


def test_the_headline_names_the_worst_alert_first_and_counts_the_rest_in_one_line() -> None:
    placed = [(f"m/d se α={a} cp geometric", UNREACHABLE) for a in (0.05, 0.1)] * 4 + [("m/d se α=0.2", DRIFT),
                                                                                        ("m/d se α=0.2", ALARM)]
    line = alerts.headline(placed)
    assert line.startswith(f"PAGE m/d se α=0.2: {DRIFT}")
    assert line.endswith("— 9 more: monitor alarm × 1, alpha unattainable × 8") and "\n" not in line
    assert alerts.headline([("x", UNREACHABLE)]).startswith("WARNING x: alpha is unattainable")
