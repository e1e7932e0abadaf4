"""Parameter constraints declared once (`PARAMETERS`) and checked from the declaration by name (`checked`)."""

from __future__ import annotations

import numpy as np
import pytest

import cic
from cic.errors import UserError
from cic.stats._validation import PARAMETERS, checked


def test_the_api_checks_its_arguments_from_the_one_declaration() -> None:
    scores, errors = np.linspace(0, 1, 200), np.zeros(200, dtype=int)
    with pytest.raises(UserError, match=r"^alpha = 1.5: must lie strictly between 0 and 1$"):
        cic.calibrate(scores, errors, alpha=1.5)
    with pytest.raises(UserError, match=r"^alphas\[1\] = 2: must lie strictly between 0 and 1$"):
        cic.evaluate_splits(scores, errors, alphas=[0.1, 2], n_splits=2)
    with pytest.raises(UserError, match=r"^n_splits = 0: must be an integer >= 1$"):
        cic.evaluate_splits(scores, errors, alphas=[0.1], n_splits=0)
    with pytest.raises(UserError, match=r"^delta = 0: must lie strictly between 0 and 1$"):
        cic.calibrate(scores, errors, alpha=0.1, delta=0)
    assert cic.calibrate(scores, errors, alpha="0.1").alpha == 0.1  # the checked value is what runs


def test_a_function_of_ones_own_is_checked_by_its_parameter_names() -> None:
    @checked
    def rule(scores: object, alpha: float, *, n_splits: int | None = None, other: float = 7.0) -> tuple:
        return alpha, n_splits, other

    assert rule(None, "0.25", n_splits=3) == (0.25, 3, 7.0)
    assert rule(None, 0.25) == (0.25, None, 7.0)  # an optional parameter left None passes unchecked
    with pytest.raises(UserError, match="n_splits = 2.5: must be an integer >= 1"):
        rule(None, 0.25, n_splits=2.5)
    with pytest.raises(UserError, match="alpha = 'x': must be a number in \\(0, 1\\)"):
        rule(None, "x")


@pytest.mark.parametrize("name", list(PARAMETERS))
def test_every_declared_parameter_refuses_a_bad_value_naming_itself(name: str) -> None:
    with pytest.raises(UserError, match=name):
        PARAMETERS[name].check(-1, name)
    assert PARAMETERS[name].says
