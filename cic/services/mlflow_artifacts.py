"""Where a local MLflow store keeps CIC's artifacts, and moving that store without losing them.

A SQLite tracking store records each experiment's artifact location as an absolute `file://` URI (MLflow
resolves relative ones when the experiment is created: mlflow/mlflow#7670), so a run directory that is moved
or copied keeps pointing at the old place: MLflow's UI and client then list no artifacts, the registry's
`models:/…@live` download returns an empty folder, and new runs would write into the old folder. CIC puts a
SQLite store's artifacts beside its file (`<dir>/mlartifacts/<experiment hash>`), which makes a move recognisable:

- `moved_experiments` finds experiments whose artifacts were put beside the store at another place;
- `relocate` rewrites their locations (experiments, runs, logged models, registry versions, trace tags) to
  the store's present folder, in one SQLite transaction, after checking the artifacts are there.

MLflow has no API to change an experiment's artifact location, so this writes MLflow's own tables; the
location-independent alternative MLflow documents is a tracking server with served artifacts
(`mlflow-artifacts:` URIs), which needs none of this. Only sqlite3 (stdlib): no MLflow import, so the CLI can
check a store before it starts a flow.
"""

from __future__ import annotations

import os
import sqlite3
import urllib.parse
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

from cic import schema
from cic.errors import UserError

ARTIFACTS_DIR = "mlartifacts"
# (table, column, extra condition) holding artifact URIs under an experiment's location; tables that MLflow's
# schema does not have (older or newer versions) are skipped
_URI_COLUMNS = (
    ("runs", "artifact_uri", ""),
    ("logged_models", "artifact_location", ""),
    ("model_versions", "source", ""),
    ("model_versions", "storage_location", ""),
    ("trace_tags", "value", "key = 'mlflow.artifactLocation'"),
)


def sqlite_file(tracking_uri: str) -> Path | None:
    """The database file of a `sqlite:///PATH` tracking URI (relative to the working directory, as for
    SQLAlchemy and MLflow), or None for any other store."""
    if not tracking_uri.startswith("sqlite:///"):
        return None
    return Path(tracking_uri.removeprefix("sqlite:///").split("?", 1)[0]).resolve()


def experiment_dir_name(experiment: str) -> str:
    """The folder of an experiment's artifacts under `mlartifacts/`: a hash of its name (any name is safe)."""
    return schema.value_hash(experiment)[:16]


def local_artifact_location(tracking_uri: str, experiment: str) -> str | None:
    """Artifacts of a local SQLite store go beside its file (mlartifacts/<experiment>), not into ./mlruns of
    whatever directory the job was started from; other stores keep their own default."""
    db_file = sqlite_file(tracking_uri)
    if db_file is None:
        return None
    return (db_file.parent / ARTIFACTS_DIR / experiment_dir_name(experiment)).as_uri()


@dataclass(frozen=True)
class MovedExperiment:
    """An experiment whose artifacts CIC put beside the store when the store was at another place."""

    experiment_id: str
    name: str
    recorded: str  # the artifact location as stored (a file:// URI under the old folder)
    present: str  # where the artifacts are now: beside the store's file

    @property
    def present_dir(self) -> Path:
        return Path(urllib.parse.unquote(urllib.parse.urlparse(self.present).path))


def _path_of(uri: str) -> Path | None:
    parsed = urllib.parse.urlparse(uri)
    if parsed.scheme == "file":
        return Path(urllib.parse.unquote(parsed.path))
    if parsed.scheme == "" and uri.startswith("/"):
        return Path(uri)
    return None


def _connect(db_file: Path, *, write: bool, wait_s: float = 30) -> sqlite3.Connection:
    if not db_file.is_file():
        raise UserError(f"MLflow store {str(db_file)!r} does not exist (--tracking-uri names a SQLite file that "
                         f"is not there)")
    # never creates a file. A read opens read-write too, with writes refused (query_only), when it may: a writer
    # killed mid-transaction (a killed `cic run` while it logged) leaves a hot journal, and only a connection
    # that may write can roll it back — a read-only one fails with "attempt to write a readonly database"
    mode = "rw" if write or os.access(db_file, os.W_OK) else "ro"
    conn = sqlite3.connect(f"{db_file.as_uri()}?mode={mode}", uri=True, timeout=wait_s, isolation_level=None)
    if not write:
        conn.execute("PRAGMA query_only = ON")
    return conn


def _store_error(db_file: Path, exc: sqlite3.DatabaseError, wait_s: float = 30) -> UserError:
    if isinstance(exc, sqlite3.OperationalError) and "locked" in str(exc):
        return UserError(f"MLflow store {str(db_file)!r} stayed locked by another writer for {wait_s:g} s; "
                          f"nothing changed, try again")
    if "readonly" in str(exc):
        return UserError(f"MLflow store {str(db_file)!r} holds a transaction a killed writer left unfinished "
                          f"({db_file.name}-journal), and this process may not write the file to roll it back; "
                          "run cic as a user who may write it")
    return UserError(f"{str(db_file)!r} is not an MLflow SQLite store ({exc})")


def _tables(conn: sqlite3.Connection) -> list[str]:
    """The tables of a SQLite file, by name (none in a file MLflow has not initialised yet)."""
    return [name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]


def _moved(conn: sqlite3.Connection, db_file: Path) -> list[MovedExperiment]:
    try:
        rows = conn.execute("SELECT experiment_id, name, artifact_location FROM experiments").fetchall()
    except sqlite3.OperationalError as exc:
        if "no such table" not in str(exc):
            raise _store_error(db_file, exc) from None
        tables = _tables(conn)
        if not tables:
            return []  # an empty SQLite file: MLflow creates its tables on first use, nothing can have moved
        shown = ", ".join(tables[:5]) + (f" and {len(tables) - 5} more" if len(tables) > 5 else "")
        raise UserError(f"{str(db_file)!r} is not an MLflow SQLite store: it holds table(s) {shown} but no "
                         "experiments table; nothing changed (point --tracking-uri at MLflow's database)") from None
    except sqlite3.DatabaseError as exc:
        raise _store_error(db_file, exc) from None
    here = db_file.parent / ARTIFACTS_DIR
    moved = []
    for experiment_id, name, location in rows:
        path = _path_of(location or "")
        if path is None or path.name != experiment_dir_name(name) or path.parent.name != ARTIFACTS_DIR:
            continue  # not put beside a store by CIC (MLflow's ./mlruns, a bucket, a user's own location)
        if path.parent != here:
            moved.append(MovedExperiment(str(experiment_id), name, location, (here / path.name).as_uri()))
    return moved


def store_state(db_file: Path) -> tuple[int, str | None, int | None]:
    """(tables, MLflow's schema revision or None, runs or None) of a local store's SQLite file, read only."""
    with closing(sqlite3.connect(f"file:{db_file}?mode=ro", uri=True)) as conn:
        tables = {name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        row = conn.execute("SELECT version_num FROM alembic_version").fetchone() \
            if "alembic_version" in tables else None
        runs = conn.execute("SELECT count(*) FROM runs").fetchone()[0] if "runs" in tables else None
    return len(tables), (row[0] if row else None), runs


def moved_experiments(tracking_uri: str) -> list[MovedExperiment]:
    """The experiments of a local SQLite store whose artifacts were placed beside it at another place (empty for
    other stores, and for a store that does not exist yet)."""
    db_file = sqlite_file(tracking_uri)
    if db_file is None or not db_file.is_file():
        return []
    with closing(_connect(db_file, write=False)) as conn:
        return _moved(conn, db_file)


def check_not_moved(tracking_uri: str) -> None:
    """Refuse to log into a moved store: new artifacts would go to the old folder, beside nothing."""
    moved = moved_experiments(tracking_uri)
    if moved:
        first, more = moved[0], (f" (and {len(moved) - 1} more)" if len(moved) > 1 else "")
        raise UserError(
            f"MLflow store {tracking_uri} was moved: experiment {first.name!r}{more} keeps its artifacts at "
            f"{first.recorded}, not beside the store; run `cic mlflow relocate --tracking-uri {tracking_uri}` first")


def _columns(conn: sqlite3.Connection, table: str) -> set[str]:
    return {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}


def relocate(tracking_uri: str, wait_s: float = 30) -> list[MovedExperiment]:
    """Point every moved experiment of a SQLite store at the artifacts beside the store's file, in one
    transaction (a kill leaves the store as it was); refused, with nothing changed, when any experiment's
    artifacts are missing there. Returns what was relocated (empty: nothing had moved)."""
    db_file = sqlite_file(tracking_uri)
    if db_file is None:
        raise UserError(f"--tracking-uri = {tracking_uri!r}: only a local SQLite store (sqlite:///PATH) keeps "
                         f"absolute artifact paths; a tracking server's mlflow-artifacts: locations move with it")
    if db_file.is_file() and db_file.stat().st_size == 0:  # SQLite would write a header into it
        raise UserError(f"MLflow store {str(db_file)!r} is an empty file: no experiment to relocate (MLflow sets "
                        "the store up on first use); nothing changed")
    with closing(_connect(db_file, write=True, wait_s=wait_s)) as conn:
        try:
            conn.execute("BEGIN IMMEDIATE")  # no other writer between reading the locations and rewriting them
        except sqlite3.DatabaseError as exc:
            raise _store_error(db_file, exc, wait_s) from None
        try:
            moved = _moved(conn, db_file)
            missing = [m for m in moved if not m.present_dir.is_dir()]
            if missing:
                raise UserError(f"experiment {missing[0].name!r}: its artifacts are not at {missing[0].present_dir} "
                                 f"(move the {ARTIFACTS_DIR} folder along with {db_file.name}); nothing changed")
            for m in moved:
                conn.execute("UPDATE experiments SET artifact_location = ? WHERE experiment_id = ?",
                             (m.present, m.experiment_id))
                for table, column, condition in _URI_COLUMNS:
                    if column not in _columns(conn, table):
                        continue
                    where = f" AND {condition}" if condition else ""
                    conn.execute(
                        f"UPDATE {table} SET {column} = ? || substr({column}, ?) "  # noqa: S608 - fixed names
                        f"WHERE ({column} = ? OR substr({column}, 1, ?) = ?){where}",
                        (m.present, len(m.recorded) + 1, m.recorded, len(m.recorded) + 1, m.recorded + "/"))
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
    return moved
