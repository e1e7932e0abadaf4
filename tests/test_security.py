"""Security checks over the source: SQL is parameterised (only schema identifiers are interpolated), nothing
unpickles, evals or loads unsafe YAML, and remote model code runs only where a config opts in."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = sorted(p for d in ("cic", "tasks", "flows") for p in (ROOT / d).rglob("*.py"))

# what an f-string handed to DuckDB may interpolate: identifiers that come from cic.schema (table and column
# names checked against it) and clauses built from them with "?" placeholders; never a value from a caller
SQL_PIECES = {"spec.name", "name", "table", "column", "columns", "select", "where", "order", "field",
              "action", "duckdb_type(dtype)", "', '.join(spec.columns)", "', '.join(spec.key)", "name or spec.name",
              "query"}  # query: a whole SELECT handed to Store.upsert_select, itself checked where it is written
SQL_CALLS = {"execute", "sql", "_scalar", "sql_frame", "upsert_select"}


def _calls(tree: ast.AST) -> list[ast.Call]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.Call)]


@pytest.mark.faults
@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_sql_interpolates_only_schema_identifiers(path: Path) -> None:
    text = path.read_text()
    tree = ast.parse(text)
    bad = []
    for call in _calls(tree):
        name = call.func.attr if isinstance(call.func, ast.Attribute) else getattr(call.func, "id", "")
        args = call.args[1:] if name in ("_scalar", "upsert_select") else call.args
        if name not in SQL_CALLS or not args:
            continue
        query = args[0]
        for node in ast.walk(query):
            if isinstance(node, ast.FormattedValue):
                piece = ast.get_source_segment(text, node.value)
                if piece not in SQL_PIECES:
                    bad.append(f"line {node.lineno}: {piece}")
    assert bad == [], f"{path.name}: SQL built from {bad}; pass values as parameters (?)"


@pytest.mark.faults
@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_unpickling_eval_or_unsafe_yaml(path: Path) -> None:
    tree = ast.parse(path.read_text())
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            names = [a.name for a in node.names] + ([node.module] if isinstance(node, ast.ImportFrom) else [])
            found += [f"line {node.lineno}: import {n}" for n in names if n and n.split(".")[0] in ("pickle",
                                                                                                 "marshal", "dill")]
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Name) and func.id in ("eval", "exec"):
                found.append(f"line {node.lineno}: {func.id}()")
            if isinstance(func, ast.Attribute) and func.attr in ("load", "load_all", "unsafe_load") and \
                    isinstance(func.value, ast.Name) and func.value.id == "yaml":
                found.append(f"line {node.lineno}: yaml.{func.attr}() (use yaml.safe_load)")
            for kw in node.keywords:
                if kw.arg == "trust_remote_code" and isinstance(kw.value, ast.Constant) and kw.value.value is True:
                    found.append(f"line {node.lineno}: trust_remote_code=True (only a config may opt in)")
    assert found == []


def test_the_checks_see_what_they_forbid(tmp_path: Path) -> None:
    """The two checks above fail on the patterns they exist for."""
    sample = tmp_path / "bad.py"
    sample.write_text("import pickle, yaml\ndef f(con, user):\n    con.execute(f\"SELECT * FROM t WHERE a = {user}\")\n"
                      "    yaml.load('x')\n    eval('1')\n    g(trust_remote_code=True)\n")
    with pytest.raises(AssertionError, match="SQL built from"):
        test_sql_interpolates_only_schema_identifiers(sample)
    with pytest.raises(AssertionError):
        test_no_unpickling_eval_or_unsafe_yaml(sample)
