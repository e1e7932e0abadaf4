"""CIC: certified abstention for LLM answers.

From calibration (score, error) pairs, learn the largest uncertainty threshold whose error rate among
accepted answers is certified <= alpha with probability >= 1 - delta, or report that alpha is unattainable.
This package root imports numpy and scipy only, so `from cic import calibrate` is cheap in any process.
"""

from cic.stats.calibration import CalibrationResult, calibrate, calibrate_judged, quantile_grid, uniform_grid
from cic.stats.gate import Gate
from cic.stats.protocol import evaluate_splits, split_masks, split_outcomes
from cic.stats.simulation import PowerRisk, SimulationResult, simulate

__version__ = "0.1.0"

__all__ = [
    "CalibrationResult",
    "Gate",
    "PowerRisk",
    "SimulationResult",
    "calibrate",
    "calibrate_judged",
    "evaluate_splits",
    "quantile_grid",
    "simulate",
    "split_masks",
    "split_outcomes",
    "uniform_grid",
]
