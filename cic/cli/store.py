"""Store and dataset commands: datasets (list, load, store), export and import of stored tables."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from cic.cli.common import (
    READ_WAIT_S,
    DbOpt,
    ForceOpt,
    console,
    err_console,
    friendly_errors,
    printable,
    say_waiting,
    styled,
)
from cic.errors import UserError


@friendly_errors
def datasets(
    name: Annotated[str | None, typer.Argument(help="Dataset to load; omit to list the registry.")] = None,
    source: Annotated[str | None, typer.Option("--source", help="'sample' (default), 'hub', a hub id, or a "
                                                               "JSONL/Parquet file or directory.")] = None,
    split: Annotated[str, typer.Option("--split", help="Which split of the dataset to load.")] = "validation",
    limit: Annotated[int | None, typer.Option("--limit", help="Keep this many questions.")] = None,
    seed: Annotated[int | None, typer.Option("--seed", help="With --limit: a seeded random subset.")] = None,
    db: Annotated[Path | None, typer.Option("--db", help="Also store the questions in this DuckDB file.")] = None,
    out: Annotated[Path | None, typer.Option("--out", help="Also write the questions to this .parquet.")] = None,
    show_prompt: Annotated[bool, typer.Option("--prompt", help="Print the prompt of the first question.")] = False,
    force: ForceOpt = False,
) -> None:
    """List the registered datasets, or load one and show, store (--db) or save (--out) its questions."""
    from cic.data import DATASETS, build_prompt, load_questions

    if name is None:
        console.print(_registry_table(DATASETS))
        return
    from cic.store.outputs import guard_output, write_frame

    if out is not None:
        if out.suffix.lower() not in (".parquet", ".pq"):
            raise UserError(f"--out = {str(out)!r}: give a .parquet file name")
        source_path = Path(source) if source and Path(source).exists() else None
        out = guard_output(out, "--out", inputs=[db, source_path], force=force, writes="frame")
    questions = load_questions(name, source, split=split, limit=limit, seed=seed)
    if out is not None:
        write_frame(questions, out, "--out", force=force)
        console.print(f"questions written to {out}", style="dim")
    if db is not None:
        _store_questions(db, questions, name, split)
    console.print(f"{name} ({split}): {questions.height} questions", highlight=False)
    with_answers = questions.select("question_id", "question", "answer").head(5)
    console.print(with_answers)
    if show_prompt and questions.height:
        console.print(build_prompt(questions.row(0, named=True)), highlight=False, markup=False)


def _registry_table(specs: Any) -> Table:
    """The registered datasets: name, prompt, hub id, offline sample, description."""
    table = Table(title="registered datasets")
    for col in ("name", "prompt", "hub", "offline sample", "description"):
        table.add_column(col)
    for spec in specs:
        hub = f"{spec.hub_id} ({spec.hub_config})" if spec.hub_config else (spec.hub_id or "—")
        table.add_row(spec.name, spec.prompt.prompt_id, hub, spec.sample or spec.default_source or "—",
                      spec.description)
    return table


def _store_questions(db: Path, questions: Any, name: str, split: str) -> None:
    """Store loaded questions (idempotent) and say how many the store holds of that dataset and split."""
    from cic.store import Store

    with Store.open(db) as store:
        store.upsert("questions", questions)
        total = store.count("questions", dataset=name, split=split)
    console.print(f"{questions.height} questions stored in {db} ({total} {name}/{split} questions in total)")


def _filters(where: list[str], table: str) -> dict[str, Any]:
    """--where column=value options as typed equality filters for Store.read."""
    import polars as pl

    from cic.schema import TABLES

    if table not in TABLES:
        raise UserError(f"table = {table!r}: unknown; tables are {', '.join(TABLES)}")
    filters: dict[str, Any] = {}
    for item in where:
        column, sep, text = item.partition("=")
        if not sep or column not in TABLES[table].columns:
            raise UserError(f"--where {item!r}: expected COLUMN=VALUE with a column of {table}: "
                             f"{', '.join(TABLES[table].columns)}")
        try:
            filters[column] = pl.Series([text]).cast(TABLES[table].columns[column]).item()
        except Exception:  # polars raises several types for a failed cast
            raise UserError(f"--where {item!r}: {text!r} is not a valid {TABLES[table].columns[column]}") from None
    return filters

@friendly_errors
def export(
    table: Annotated[str, typer.Argument(help="Table: questions, runs, generations, scores, labels, "
                                              "calibrations or evaluations.")],
    out: Annotated[Path, typer.Argument(help="Parquet file to write.")],
    db: DbOpt = Path("cic.duckdb"),
    where: Annotated[list[str] | None, typer.Option("--where", help="Keep rows with COLUMN=VALUE (repeatable).")]
    = None,
    force: ForceOpt = False,
) -> None:
    """Write a stored table to Parquet (read it back anywhere, or `cic import` it into another store)."""
    from cic.store import Store
    from cic.store.outputs import guard_output

    filters = _filters(where or [], table)
    if out.suffix.lower() not in (".parquet", ".pq"):
        raise UserError(f"OUT = {str(out)!r}: give a .parquet file name")
    out = guard_output(out, "OUT", inputs=[db], force=force, writes="frame")
    with Store.open(db, read_only=True, wait_s=READ_WAIT_S, waiting=say_waiting) as store:
        rows = store.export(table, out, **filters)
    console.print(f"{rows} {table} rows written to {out}")


@friendly_errors
def import_table(
    file: Annotated[Path, typer.Argument(help="Parquet file written by `cic export` (or with a table's columns).")],
    db: DbOpt = Path("cic.duckdb"),
    table: Annotated[str | None, typer.Option("--table", help="Target table when the file does not name it.")]
    = None,
    replace: Annotated[bool, typer.Option("--replace", help="Allow rows that change stored ones (recorded in "
                                          "label_events / record_events; the gates whose window held them are "
                                          "flagged).")] = False,
) -> None:
    """Upsert a Parquet table into the store (idempotent: importing twice changes nothing; rows that would change
    stored ones are refused unless --replace)."""
    from cic import schema
    from cic.pipeline.production.table_import import import_table as import_rows
    from cic.store import Store
    from cic.store.imports import checked_import

    checked_import(file, table, schema.TABLES)  # a refusal before the store is opened creates nothing
    with Store.open(db) as store:
        stats = import_rows(store, file, table, replace=replace)
        total = store.count(stats.table)
    console.print(f"{stats.rows} {stats.table} rows imported into {db} ({total} in the table)")
    if stats.replaced:
        err_console.print(styled(("replaced:", "bold yellow"), printable(
            f" {stats.replaced} stored {stats.table} row(s) changed; "
            + (f"gates flagged: {', '.join(g[:12] for g in stats.flagged_gates)} — `cic gate list` shows why"
               if stats.flagged_gates else "no gate's window held them"))), soft_wrap=True)


@friendly_errors
def convert(
    source: Annotated[Path, typer.Argument(help="An evaluation output: lm-eval --log_samples samples_*.jsonl, an "
                                                "inspect-ai JSON log, a HELM run directory, or a folder of them.")],
    out: Annotated[Path, typer.Option("--out", help="The long (score, error) table to write: .parquet, .csv or "
                                                    ".jsonl.")] = Path("scores.parquet"),
    harness: Annotated[str | None, typer.Option("--harness", help="Which harness wrote it (default: recognised "
                                                                  "from the file).")] = None,
    force: ForceOpt = False,
) -> None:
    """Read a harness's evaluation output as the (score, error) table calibrate, evaluate, report and log take."""
    from cic.store.harness import read_harness
    from cic.store.outputs import guard_output, write_frame

    if out.suffix.lower() not in (".parquet", ".pq", ".csv", ".jsonl"):
        raise UserError(f"--out = {str(out)!r}: give a .parquet, .csv or .jsonl file name")
    target = guard_output(out, "--out", inputs=[source], force=force, writes="frame")
    table = read_harness(source, harness)
    if target.suffix.lower() == ".jsonl":
        from cic.store.outputs import write_text

        write_text(target, "".join(table.write_ndjson()), "--out")
    else:
        write_frame(table, target, "--out", force=force)
    groups = table.group_by("model", "dataset", "estimator", "criterion", maintain_order=True).len()
    for row in groups.iter_rows(named=True):
        console.print(printable(f"{row['model']} · {row['dataset']} · {row['estimator']} · {row['criterion']}: "
                                f"{row['len']} questions"), highlight=False)
    console.print(printable(f"{table.height} rows ({table.get_column('source')[0]}) written to {target}; certify "
                            f"them with `cic report {target}` or `cic log {target}`"), highlight=False)


COMMANDS = {"datasets": datasets, "export": export, "import": import_table, "convert": convert}
