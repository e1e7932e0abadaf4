"""`cic calibrate FILE --cascade M1,M2` and `--estimator auto`: one guarantee for a system of models or for the
estimator chosen, from a long score table (model, dataset, estimator, criterion, question_id, score, error)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from cic.cli.common import console
from cic.errors import UserError


def narrow(file: Path, filters: dict[str, str | None]) -> Any:
    """The long table's rows for one dataset and criterion (named, or the table's only one), joined by question."""
    import polars as pl

    from cic.store.score_files import read_long_table

    if file.suffix == ".duckdb":
        raise UserError(f"FILE = {str(file)!r}: --cascade and --estimator auto read a score table (Parquet/CSV in "
                        "the long layout; `cic export` writes one from a store)")
    frame = read_long_table(file)
    if "question_id" not in frame.columns:
        raise UserError(f"{str(file)!r} has no question_id column: a cascade joins models on it")
    for key in ("model", "dataset", "criterion"):
        if filters.get(key):
            frame = frame.filter(pl.col(key) == filters[key])
            if frame.height == 0:
                raise UserError(f"--{key} = {filters[key]!r}: no rows of {str(file)!r} have it")
    for key in ("dataset", "criterion"):
        values = sorted(frame.get_column(key).unique().to_list())
        if len(values) > 1:
            raise UserError(f"{str(file)!r} holds {key}s {', '.join(values)}: name one with --{key}")
    return frame


def pairs_by(frame: Any, column: str, names: list[str], estimator: str | None) -> tuple[list[Any], list[Any], int]:
    """Per name (a model or an estimator), its (score, error) arrays on the questions every name answered."""
    import polars as pl

    parts = []
    for name in names:
        rows = frame.filter(pl.col(column) == name)
        if column == "model" and estimator:
            rows = rows.filter(pl.col("estimator") == estimator)
        if rows.height == 0:
            raise UserError(f"--cascade: no rows for {column} {name!r}"
                            + (f" with estimator {estimator!r}" if estimator else ""))
        if column == "model" and rows.get_column("estimator").n_unique() > 1:
            raise UserError(f"model {name!r} has several estimators: name the one each model uses with --estimator")
        parts.append(rows.select("question_id", pl.col("score").alias(f"s{len(parts)}"),
                                 pl.col("error").alias(f"e{len(parts)}")))
    joined = parts[0]
    for part in parts[1:]:
        joined = joined.join(part, on="question_id", how="inner")
    if joined.height == 0:
        raise UserError(f"the {column}s {', '.join(names)} share no question_id: nothing to calibrate on")
    scores = [joined.get_column(f"s{i}").to_numpy() for i in range(len(names))]
    errors = [joined.get_column(f"e{i}").to_numpy() for i in range(len(names))]
    return scores, errors, joined.height


def run_cascade(file: Path, spec: str, filters: dict[str, str | None], *, alpha: float, delta: float, bound: str,
                search: str, json_out: Path | None) -> None:
    """Certify the cascade SPEC (models in cost order, comma-separated) and print it."""
    from cic.stats.cascades import calibrate_cascade
    from cic.store.outputs import write_text

    models = [m.strip() for m in spec.split(",") if m.strip()]
    if len(models) < 2 or len(set(models)) != len(models):
        raise UserError(f"--cascade = {spec!r}: two or more distinct models, cheapest first (e.g. small,big)")
    frame = narrow(file, {**filters, "model": None})
    scores, errors, n = pairs_by(frame, "model", models, filters.get("estimator"))
    result = calibrate_cascade(scores, errors, alpha=alpha, delta=delta, bound=bound, search=search, models=models)
    console.print(result.summary(), highlight=False)
    console.print(f"guarantee: {result.guarantee} ({n} questions every model answered)", style="dim",
                  highlight=False)
    if json_out is not None:
        write_text(json_out, json.dumps({"kind": "cic.cascade_result", **dataclasses.asdict(result)}, indent=2,
                                        default=float) + "\n", "--json")
        console.print(f"result written to {json_out}", style="dim")


def run_estimator_choice(file: Path, filters: dict[str, str | None], *, alpha: float, delta: float, bound: str,
                         search: str, json_out: Path | None) -> None:
    """Certify every estimator of one model at delta / K and print the one that answers the most."""
    from cic.stats.cascades import choose_estimator
    from cic.store.outputs import write_text

    frame = narrow(file, filters)
    if frame.get_column("model").n_unique() > 1:
        raise UserError(f"{str(file)!r} holds several models: name one with --model")
    names = sorted(frame.get_column("estimator").unique().to_list())
    scores, errors, n = pairs_by(frame, "estimator", names, None)
    choice = choose_estimator({k: (s, e) for k, s, e in zip(names, scores, errors, strict=True)}, alpha=alpha,
                              delta=delta, bound=bound, search=search)
    if choice.estimator is None:
        console.print(f"alpha = {alpha:g} is unattainable for every one of the {len(names)} estimators at delta / "
                      f"{len(names)}: abstain on everything", highlight=False)
    else:
        console.print(f"estimator {choice.estimator}: {choice.result.summary()}", highlight=False)
    console.print(f"guarantee: {choice.guarantee} ({n} questions)", style="dim", highlight=False)
    if json_out is not None:
        payload = {"kind": "cic.estimator_choice", "estimator": choice.estimator, "delta": choice.delta,
                   "guarantee": choice.guarantee,
                   "results": {k: json.loads(r.to_json()) for k, r in choice.results.items()}}
        write_text(json_out, json.dumps(payload, indent=2) + "\n", "--json")
        console.print(f"result written to {json_out}", style="dim")
