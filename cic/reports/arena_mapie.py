"""MAPIE 1.6's Learn-then-Test controllers as arena methods, where MAPIE is installed (it is not a CIC dependency:
`pip install mapie==1.6.0`). Imported only when the arena runs one of them.

- `mapie-binary`: `BinaryClassificationController(risk="precision")` over its 100-point grid with Bonferroni–Holm;
  a grid point that accepts no calibration answer gets a NaN p-value from MAPIE 1.6, which its Holm reads as a
  stop, so those are read as 1 here (the point kept in the family, never rejected: what a fix in MAPIE would do).
- `mapie-multiclass` (a score that is 1 − the top option's probability): `MultiClassificationLTTController`
  predicting the top option and abstaining when its probability is under λ, precision of the predictions made at
  1 − α, Holm over λ ∈ linspace(0, 0.99, 100), the valid λ that abstains least. The option matrix handed to MAPIE
  is the top option at 1 − U and the rest spread evenly over four others, so its accept/abstain decisions and
  their correctness are exactly the table's.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

OPTIONS = 5


def installed() -> bool:
    """Whether MAPIE can be imported (found without importing it)."""
    import importlib.util

    return importlib.util.find_spec("mapie") is not None


def nan_safe_holm() -> Any:
    """MAPIE's own Bonferroni–Holm with NaN p-values (grid points accepting nothing) read as 1; `saw_nan` says
    whether the last run had any."""
    from mapie.risk_control.fwer_control import FWERBonferroniHolm

    class NanSafeHolm(FWERBonferroniHolm):
        saw_nan = False

        def run(self, p_values: Any, delta: float) -> Any:
            p = np.asarray(p_values, dtype=float)
            NanSafeHolm.saw_nan = bool(np.isnan(p).any())
            return super().run(np.nan_to_num(p, nan=1.0), delta)

    return NanSafeHolm()


def binary_threshold(u: np.ndarray, e: np.ndarray, alpha: float, delta: float, fwer: Any = None) -> float | None:
    """MAPIE's certified threshold on U (accept when U <= it), or None."""
    from mapie.risk_control import BinaryClassificationController

    def proba(x: np.ndarray) -> np.ndarray:  # class 1 = a correct answer, with "probability" 1 - U
        return np.column_stack([x[:, 0], 1.0 - x[:, 0]])

    controller = BinaryClassificationController(predict_function=proba, risk="precision", target_level=1 - alpha,
                                                confidence_level=1 - delta,
                                                fwer_method=nan_safe_holm() if fwer is None else fwer)
    with warnings.catch_warnings():  # "No predict parameters were found": the arena counts it as accepting nothing
        warnings.simplefilter("ignore", UserWarning)
        controller.calibrate(u.reshape(-1, 1), (e == 0).astype(int))
    best = controller.best_predict_param
    return None if best is None or not np.isfinite(np.asarray(best, dtype=float)).all() else 1.0 - float(best)


def binary(u: np.ndarray, e: np.ndarray, test: np.ndarray, alpha: float, delta: float) -> np.ndarray:
    t = binary_threshold(u, e, alpha, delta)
    return np.zeros(test.shape, dtype=bool) if t is None else test <= t


def option_matrix(u: np.ndarray, options: int = OPTIONS) -> np.ndarray:
    """The top option at 1 − u (column 0), the rest of the mass spread evenly over the other options."""
    top = 1.0 - u
    rest = np.repeat(((1.0 - top) / (options - 1))[:, None], options - 1, axis=1)
    return np.column_stack([top, rest])


def multiclass(u: np.ndarray, e: np.ndarray, test: np.ndarray, alpha: float, delta: float) -> np.ndarray:
    from mapie.risk_control import BinaryRisk, MultiClassificationLTTController, abstention_rate

    selective_precision = BinaryRisk(risk_occurrence=lambda y, p: p.ravel() == y.ravel(),
                                     risk_condition=lambda y, p: p.ravel() == p.ravel(),  # not abstained (NaN)
                                     higher_is_better=True)
    controller = MultiClassificationLTTController(predict_function=lambda x: x, risks=[selective_precision],
                                                  target_level=[1 - alpha], confidence_level=1 - delta,
                                                  classes=np.arange(OPTIONS), best_predict_param_choice=abstention_rate)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        controller.calibrate(option_matrix(u), np.where(e == 0, 0, 1))  # right: the top option; wrong: another
    if controller.best_predict_param is None:
        return np.zeros(test.shape, dtype=bool)
    predicted = np.asarray(controller.predict(option_matrix(test)), dtype=float)
    return predicted == predicted  # not NaN: answered
