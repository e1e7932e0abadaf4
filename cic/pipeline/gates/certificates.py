"""Re-verify a stored gate's certificate from the store's own pairs, so that no edited field makes a gate serve.

A gate's calibration pairs are rebuilt from what the store holds: the pairs of its run, estimator and criterion
seen within its window and labelled no later than the gate was created (a later label cannot have been among
them; under `missing_labels: worst_case` such a record, and one never labelled, counts as the error it was
counted as), the newest `window` of them (its plan says how many). Their fingerprint must be the stored
one; the search is re-run on them — after the same seeded pilot split, with the stored arguments, at the
gate's level (delta / groups) — and must certify the stored threshold with the stored n, errors and bound; the
gate's id must be the hash of all of it. Editing the threshold, the counts, the result JSON, the level, the
search arguments or the labels underneath is therefore caught, whichever fields are edited together.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import polars as pl

from cic import schema
from cic.errors import UserError
from cic.pipeline.gates.gate_rows import GateRow
from cic.pipeline.run.stored_calibration import pair_columns

if TYPE_CHECKING:
    from cic.store import Store

GROUP_COLUMNS = ("run_key", "estimator", "criterion")


def plan_of(row: GateRow) -> dict[str, Any]:
    """The gate's stored plan; a gate stored before plans existed: every pair of its window, no arguments."""
    text = row.get("plan_json")
    if not text:
        return {"window": None, "pilot": None, "args": {}}
    try:
        plan = json.loads(text)
        return {"window": plan["window"], "pilot": plan["pilot"], "args": dict(plan["args"])}
    except (ValueError, TypeError, KeyError) as exc:
        raise UserError(f"stored gate {row['calibration_id'][:12]}: plan_json does not parse ({exc}); refusing to "
                        "serve it") from None


def rebuilt_pairs(row: GateRow, group: pl.DataFrame) -> pl.DataFrame:
    """The pairs the gate was calibrated on, from its group's stored pairs (oldest first, with `labelled_at`,
    `stored_at` and `labelled`, unlabelled records as errors): under `missing_labels: worst_case` every record
    stored by the gate's creation, one whose label came later counted as the error it was then; otherwise the
    records labelled by then."""
    from cic.pipeline.run.missing_labels import as_counted_then, keeps_missing, policy_of

    created = row["created_at"]
    if keeps_missing(policy_of(row.get("plan_json"))):
        pairs = as_counted_then(group.filter(pl.col("stored_at") <= created), created)
    else:
        pairs = group.filter(pl.col("labelled") & (pl.col("labelled_at") <= created))
    if row["window_from"] is not None:
        pairs = pairs.filter(pl.col("at") >= row["window_from"])
    if row["window_to"] is not None:
        pairs = pairs.filter(pl.col("at") <= row["window_to"])
    window = plan_of(row)["window"]
    if isinstance(window, int) and pairs.height > window:
        pairs = pairs.tail(window)
    if "human_at" in pairs.columns:  # a person's verdict stored after the gate was not among its labels
        pairs = pairs.with_columns(human=pl.when(pl.col("human_at") <= created).then(pl.col("human")))
    return pairs.select(pair_columns(pairs))


def group_pairs(store: Store, row: GateRow) -> pl.DataFrame:
    """The stored pairs of a single gate's group (`certified_pairs_of_runs`, unlabelled records included); for a
    judge-plus-people gate the judge's pairs with the people's verdicts beside (`judged_pairs_of_runs`)."""
    from cic.store.queries import certified_pairs_of_runs, judged_pairs_of_runs

    parts = schema.judged_parts(row["criterion"])
    if parts is not None:
        return judged_pairs_of_runs(store, [row["run_key"]], judge=parts[0], people=parts[1],
                                    estimator=row["estimator"], missing=True, certified=True)
    pairs = certified_pairs_of_runs(store, [row["run_key"]], missing=True)
    return pairs.filter((pl.col("estimator") == row["estimator"]) & (pl.col("criterion") == row["criterion"]))


def unattainable_limits(store: Store, row: GateRow) -> dict[str, Any]:
    """For a single gate that certifies nothing, its pairs' limits (`cic.stats.limits`): the score's limit, any
    rule's ceiling and why in words; {} for a system or anytime gate, or one whose pairs are gone."""
    from cic.pipeline.gates.anytime_gates import is_anytime
    from cic.pipeline.run.stored_calibration import pilot_split, truth_of
    from cic.stats.limits import ceiling, score_limit, window_limits

    if row.is_system or is_anytime(row) or row["threshold"] is not None:
        return {}
    used, _ = pilot_split(rebuilt_pairs(row, group_pairs(store, row)), plan_of(row)["pilot"])
    used = truth_of(used)  # a judge-plus-people gate's limits: on the people's verdicts
    if used.height == 0:
        return {}
    scores, errors = used.get_column("score").to_numpy(), used.get_column("error").to_numpy()
    alpha = row["alpha"]
    return {"score_limit": score_limit(scores, errors, alpha), "ceiling": ceiling(float(np.mean(errors)), alpha),
            "why": window_limits(scores, errors, alpha)}


def _refuse(row: GateRow, why: str) -> UserError:
    return UserError(f"stored gate {row['calibration_id'][:12]}: {why}; refusing to serve it (recalibrate to "
                     "replace it)")


def recertify(row: GateRow, group: pl.DataFrame) -> None:
    """Raise unless the gate's certificate is what its rebuilt pairs give (see the module docstring)."""
    from cic.pipeline.run.stored_calibration import data_fingerprint, pilot_split
    from cic.stats.calibration import quantile_grid

    plan, pairs = plan_of(row), rebuilt_pairs(row, group)
    if data_fingerprint(pairs) != row["data_fingerprint"]:
        raise _refuse(row, f"its calibration pairs are no longer in the store ({pairs.height} rebuilt from its "
                           f"window, {row['n_cal']} certified; their fingerprint differs)")
    used, pilot_scores = pilot_split(pairs, plan["pilot"])
    args = {k: np.asarray(v, dtype=float) if k == "grid" else v for k, v in plan["args"].items()}
    grid = args.get("grid")
    if pilot_scores is not None and (grid is None or not np.array_equal(grid, quantile_grid(pilot_scores, len(grid)))):
        raise _refuse(row, "its stored grid is not the quantiles of its pilot split")
    groups = row.get("groups") or 1
    try:
        result = _certify_again(row, used, groups, args)
    except (ValueError, TypeError, UserError) as exc:
        raise _refuse(row, f"its search does not re-run on its stored plan ({exc})") from None
    for column, again in (("threshold", result.threshold), ("n_accepted", result.n_accepted),
                          ("n_errors", result.n_errors), ("n_cal", result.n_calibration),
                          ("bound_value", result.bound_value)):
        stored = row[column]
        if not (stored == again or (isinstance(stored, float) and isinstance(again, float)
                                    and math.isclose(stored, again, rel_tol=1e-9))):
            raise _refuse(row, f"{column} = {stored!r}, but its search re-run on its stored pairs certifies "
                               f"{again!r}")
    together = (groups,) if groups > 1 else ()
    expected = schema.value_hash(row["kind"], row["run_key"], row["estimator"], row["criterion"], row["alpha"],
                                 row["delta"], row["bound"], row["search"], row["data_fingerprint"],
                                 schema.canonical_json(plan["args"]), *together)
    if expected != row["calibration_id"]:
        raise _refuse(row, "its id is not the hash of its run, level, search and data (a field was edited)")


def _certify_again(row: GateRow, used: pl.DataFrame, groups: int, args: dict[str, Any]) -> Any:
    """The gate's search re-run on its rebuilt pairs at its level: the binomial tests, or a judge-plus-people
    gate's prediction-powered ones (`cic.calibrate_judged`)."""
    from cic.stats.calibration import calibrate, calibrate_judged

    scores, errors = used.get_column("score").to_numpy(), used.get_column("error").to_numpy()
    level = row["delta"] / groups
    if "human" in used.columns:
        return calibrate_judged(scores, errors, used.get_column("human").to_numpy(), alpha=row["alpha"], delta=level,
                                search=row["search"], ids=used.get_column("question_id").to_list(), **args)
    return calibrate(scores, errors, alpha=row["alpha"], delta=level, bound=row["bound"], search=row["search"],
                     **args)


def recertify_keys(store: Store, rows: Sequence[GateRow]) -> None:
    """Raise unless each gate's served key columns (model, dataset) are its run's: the id hashes the run, not the
    names a reader looks a gate up by, so a renamed model would otherwise serve another model's threshold."""
    wanted = sorted({r["run_key"] for r in rows})
    runs = {r["run_key"]: r for r in store.read("runs").filter(pl.col("run_key").is_in(wanted))
            .select("run_key", "model", "dataset").iter_rows(named=True)}
    for row in rows:
        run = runs.get(row["run_key"])
        if run is None:
            raise _refuse(row, f"its run {row['run_key']!r} is not in the store")
        for column in ("model", "dataset"):
            if row[column] != run[column]:
                raise _refuse(row, f"{column} = {row[column]!r}, but it was certified on run {row['run_key']} of "
                                   f"{column} {run[column]!r}")


def recertify_all(store: Store, rows: Sequence[GateRow]) -> None:
    """`recertify` each gate (its key columns first: `recertify_keys`), the pairs of all their runs read in one
    query."""
    from cic.pipeline.gates.anytime_gates import is_anytime, recertify_anytime
    from cic.store.queries import certified_pairs_of_runs

    recertify_keys(store, rows)

    for row in rows:
        if is_anytime(row):
            recertify_anytime(store, row)
    rows = [r for r in rows if not is_anytime(r)]
    if not rows:
        return
    pairs = certified_pairs_of_runs(store, sorted({r["run_key"] for r in rows}), missing=True)
    groups = pairs.partition_by(list(GROUP_COLUMNS), as_dict=True) if pairs.height else {}
    empty = pairs.clear()
    for row in rows:
        judged = schema.judged_parts(row["criterion"]) is not None  # read on their own: two criteria joined
        recertify(row, group_pairs(store, row) if judged else groups.get(tuple(row[c] for c in GROUP_COLUMNS), empty))
