"""What a certificate does with records whose labels never came: the label policy, its words and its cut.

A record whose label window closed without a label is, by default (`worst_case`), counted as an error wherever a
threshold accepts it. Every counted error count is then at least the true one, at every threshold, so a certificate
on the imputed pairs holds for the true ones whatever decides which labels go missing — the score, the correctness,
both — at the price of coverage where labels are missing. `at_random` leaves unlabelled records out (the behaviour
before this policy existed): valid only when labels go missing independently of score and correctness, and every
surface that shows such a gate says so. A gate stores its policy in its plan; a gate stored before plans named one
was certified under `at_random` and is re-certified that way.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # polars is imported where a cut runs: the config reads this module's words
    import polars as pl

WORST_CASE = "worst_case"
AT_RANDOM = "at_random"
POLICIES = (WORST_CASE, AT_RANDOM)

#: the label window of records ingested without their label when none is configured: labels may come this late
DEFAULT_LABEL_WINDOW = timedelta(days=14)

ASSUMPTIONS = {
    WORST_CASE: "labels missing when their window closed count as errors: valid whatever decides which go missing",
    AT_RANDOM: "assumes labels go missing independently of score and correctness",
}
EARLIER = " (certified by an earlier version; `cic run` or `cic recalibrate` re-certifies it)"

#: what `calibration.missing_labels` and `--missing-labels` say: the assumption in the words every surface shows
HELP = (f"what a record whose label window closed without a label counts as: worst_case (default): "
        f"{ASSUMPTIONS[WORST_CASE]}; at_random: leaves it out, {ASSUMPTIONS[AT_RANDOM]}")


def policy_of(plan: dict[str, Any] | str | None) -> str | None:
    """The label policy a gate's plan names (a dict or its JSON); None: a gate stored before plans named one
    (certified leaving unlabelled records out)."""
    if isinstance(plan, str) or plan is None:
        try:
            plan = json.loads(plan or "{}")
        except ValueError:
            return None
    value = plan.get("missing_labels") if isinstance(plan, dict) else None
    return value if value in POLICIES else None


def assumption(policy: str | None) -> str:
    """The label assumption a gate of this policy rests on, in the words every surface shows."""
    return ASSUMPTIONS[policy] if policy in ASSUMPTIONS else ASSUMPTIONS[AT_RANDOM] + EARLIER


def gate_assumption(row: Any) -> str:
    """The label assumption of a stored gate (a row with `plan_json`; a system gate — a cascade, an estimator
    chosen — leaves questions without a label out, so it assumes they go missing at random; a judge-plus-people
    gate adds that people labelled a random subset)."""
    from cic.schema import judged_parts
    from cic.stats.calibration import JUDGED_ASSUMPTION

    if row.get("system") is not None:
        return ASSUMPTIONS[AT_RANDOM] + " (a system gate leaves unlabelled questions out)"
    judged = judged_parts(row.get("criterion") or "") is not None  # a judge's labels corrected by people's
    return assumption(policy_of(row.get("plan_json"))) + (f"; {JUDGED_ASSUMPTION}" if judged else "")


def keeps_missing(policy: str | None) -> bool:
    """Whether unlabelled records are counted (as errors) under this policy."""
    return policy == WORST_CASE


def counted(pairs: pl.DataFrame, through: datetime | None, policy: str | None) -> pl.DataFrame:
    """The pairs a certificate counts: seen at or before `through` (now − the label window; None: every pair),
    unlabelled ones (column `labelled` false, error 1) only under `worst_case`."""
    import polars as pl

    if "labelled" in pairs.columns and not keeps_missing(policy):
        pairs = pairs.filter(pl.col("labelled"))
    return pairs if through is None else pairs.filter(pl.col("at") <= through)


def observable(pairs: pl.DataFrame, through: datetime | None) -> pl.DataFrame:
    """What a monitor counts: every label as it arrives, and an unlabelled record only once its window closed."""
    import polars as pl

    if "labelled" not in pairs.columns:
        return pairs
    closed = pl.lit(True) if through is None else pl.col("at") <= through
    return pairs.filter(pl.col("labelled") | closed)


def as_counted_then(pairs: pl.DataFrame, then: Any) -> pl.DataFrame:
    """Pairs (with `labelled`, `labelled_at`) as a worst-case certificate counted them at `then` (a time, or an
    expression per row): a label stored after it — or never — is the error the record was counted as."""
    import polars as pl

    known = pl.col("labelled") & (pl.col("labelled_at") <= then)
    return pairs.with_columns(error=pl.when(known).then(pl.col("error")).otherwise(1).cast(pairs.schema["error"]))


def missing_share(pairs: pl.DataFrame) -> float:
    """The share of counted pairs whose label never came (0 for no pairs)."""
    if pairs.height == 0 or "labelled" not in pairs.columns:
        return 0.0
    return float((~pairs.get_column("labelled")).sum()) / pairs.height
