"""Security checks over the source: SQL is parameterised (only schema identifiers are interpolated), nothing
unpickles, evals or loads unsafe YAML, and remote model code runs only where a config opts in."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = sorted(p for d in ("cic", "tasks", "flows", "infra", "benchmarks") for p in (ROOT / d).rglob("*.py"))

# what an f-string handed to DuckDB may interpolate: identifiers that come from cic.schema (table and column
# names checked against it) and clauses built from them with "?" placeholders; never a value from a caller
SQL_PIECES = {"spec.name", "name", "table", "column", "columns", "select", "where", "order", "field",
              "action", "duckdb_type(dtype)", "', '.join(spec.columns)", "', '.join(spec.key)", "name or spec.name",
              "query"}  # query: a whole SELECT handed to Store.upsert_select, itself checked where it is written
SQL_CALLS = {"execute", "sql", "_scalar", "sql_frame", "upsert_select"}


def _calls(tree: ast.AST) -> list[ast.Call]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.Call)]


def sql_built_from_values(path: Path) -> list[str]:
    """Pieces interpolated into a query handed to DuckDB that are not schema identifiers."""
    text = path.read_text()
    bad = []
    for call in _calls(ast.parse(text)):
        name = call.func.attr if isinstance(call.func, ast.Attribute) else getattr(call.func, "id", "")
        args = call.args[1:] if name in ("_scalar", "upsert_select") else call.args
        if name not in SQL_CALLS or not args:
            continue
        for node in ast.walk(args[0]):
            if isinstance(node, ast.FormattedValue):
                piece = ast.get_source_segment(text, node.value)
                if piece not in SQL_PIECES:
                    bad.append(f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path.name}:"
                               f"{node.lineno}: {piece}")
    return bad


def unsafe_loading(path: Path) -> list[str]:
    """Imports of pickle/marshal/dill, eval/exec calls and yaml.load (not safe_load)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import | ast.ImportFrom):
            names = [a.name for a in node.names] + ([node.module] if isinstance(node, ast.ImportFrom) else [])
            found += [f"{path.name}:{node.lineno}: import {n}" for n in names
                      if n and n.split(".")[0] in ("pickle", "marshal", "dill")]
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Name) and func.id in ("eval", "exec"):
                found.append(f"{path.name}:{node.lineno}: {func.id}()")
            if isinstance(func, ast.Attribute) and func.attr in ("load", "load_all", "unsafe_load") and \
                    isinstance(func.value, ast.Name) and func.value.id == "yaml":
                found.append(f"{path.name}:{node.lineno}: yaml.{func.attr}() (use yaml.safe_load)")
    return found


def remote_code_forced(path: Path) -> list[str]:
    """`trust_remote_code=True` written in the source (only a config may opt in)."""
    return [f"{path.name}:{call.lineno}: trust_remote_code=True" for call in _calls(ast.parse(path.read_text()))
            for kw in call.keywords
            if kw.arg == "trust_remote_code" and isinstance(kw.value, ast.Constant) and kw.value.value is True]


@pytest.mark.faults
def test_sql_interpolates_only_schema_identifiers() -> None:
    bad = [line for path in SOURCES for line in sql_built_from_values(path)]
    assert bad == [], f"SQL built from {bad}; pass values as parameters (?)"


@pytest.mark.faults
def test_no_unpickling_eval_or_unsafe_yaml() -> None:
    assert [line for path in SOURCES for line in unsafe_loading(path)] == []


@pytest.mark.faults
def test_remote_model_code_only_where_a_config_opts_in() -> None:
    assert [line for path in SOURCES for line in remote_code_forced(path)] == []


def test_the_checks_see_what_they_forbid(tmp_path: Path) -> None:
    """Each rule finds the pattern it exists for, and passes the safe spelling."""
    sample = tmp_path / "bad.py"
    sample.write_text("import pickle, yaml\ndef f(con, user):\n    con.execute(f\"SELECT * FROM t WHERE a = {user}\")\n"
                      "    yaml.load('x')\n    eval('1')\n    g(trust_remote_code=True)\n")
    assert [line.split(": ", 1)[1] for line in sql_built_from_values(sample)] == ["user"]
    assert len(unsafe_loading(sample)) == 3
    assert len(remote_code_forced(sample)) == 1
    safe = tmp_path / "safe.py"
    safe.write_text("import yaml\ndef f(con, user, spec):\n    con.execute(f\"SELECT * FROM {spec.name} WHERE a = ?\", "
                    "[user])\n    yaml.safe_load('x')\n    g(trust_remote_code=config.trust)\n")
    assert sql_built_from_values(safe) == unsafe_loading(safe) == remote_code_forced(safe) == []
