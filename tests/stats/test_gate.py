"""Gate: the serving artifact's decisions and its JSON round trip."""

from __future__ import annotations

import numpy as np
import pytest

from cic import Gate
from cic.errors import UserError


def test_accept_and_decide_include_the_threshold() -> None:
    gate = Gate(0.5)
    np.testing.assert_array_equal(gate.accept([0.1, 0.5, 0.50001, 2.0]), [True, True, False, False])
    assert gate.decide(0.5) == "answer" and gate.decide(0.9) == "abstain"
    assert gate.accept(0.2).shape == (1,)


def test_none_threshold_abstains_on_everything() -> None:
    gate = Gate(None)
    assert not gate.accept([-1e300, 0.0, 5.0]).any()
    assert gate.decide(-1.0) == "abstain"


def test_json_round_trip_keeps_threshold_exactly() -> None:
    for gate in (Gate(0.1 + 0.2, {"alpha": 0.1, "bound": "cp"}), Gate(None), Gate(-3)):
        back = Gate.from_json(gate.to_json())
        assert back == gate and back.threshold == gate.threshold and back.metadata == gate.metadata


@pytest.mark.parametrize("threshold", [float("nan"), float("inf"), "0.5", True])
def test_invalid_threshold_is_refused(threshold: object) -> None:
    with pytest.raises(UserError, match="threshold ="):
        Gate(threshold)  # type: ignore[arg-type]


def test_nan_score_is_an_error_not_a_silent_decision() -> None:
    with pytest.raises(UserError, match=r"scores\[1\] = nan"):
        Gate(0.5).accept([0.1, float("nan")])


@pytest.mark.parametrize("text,message", [("[]", "kind = None"), ('{"kind": "cic.gate"}', "threshold"),
                                          ("{", "not valid JSON")])
def test_from_json_refuses_other_documents(text: str, message: str) -> None:
    with pytest.raises(UserError, match=message):
        Gate.from_json(text)
