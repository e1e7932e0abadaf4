"""The layout holds over cic/, tasks/ and flows/: layers import downwards only, nothing cycles, the statistics core
stays light, cic/pipeline stays service-free."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from cic.errors import UserError
from cic.llm.engines import ENGINES, Engine, engine_class

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("cic", "tasks", "flows")

# lowest first: a module may import its own layer and the ones before it, never a later one; the CLI imports
# tasks and flows only inside the command that runs them (test_nothing_in_cic_imports_flows_or_tasks_when_imported)
LAYERS = ("cic.errors", "cic.registry", "cic.stats", "cic.schema", "cic.data", "cic.llm", "cic.store", "cic.reports",
          "cic.pipeline", "cic.services", "tasks", "flows", "cic.cli")
SERVICES = ("prefect", "ray", "mlflow", "psutil", "subprocess")
HEAVY = ("torch", "transformers", "sentence_transformers", "prefect", "ray", "mlflow", "duckdb", "polars",
         "pandas", "matplotlib")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, *, top_level_only: bool) -> list[tuple[str, int]]:
    """(imported module, line) for every import in the file, or only those run when the module is imported."""
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    found = []
    for node in nodes:
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.module, node.lineno))
            found += [(f"{node.module}.{alias.name}", node.lineno) for alias in node.names]
    return found


def layer_of(module: str) -> int | None:
    for rank, layer in enumerate(LAYERS):
        if module == layer or module.startswith(layer + "."):
            return rank
    return None


MODULES = {module_name(p): p for package in PACKAGES for p in sorted((ROOT / package).rglob("*.py"))}


def test_every_module_belongs_to_a_layer() -> None:
    assert [m for m in MODULES if m not in PACKAGES and layer_of(m) is None] == []


def test_a_lower_layer_never_imports_a_higher_one() -> None:
    wrong = []
    for module, path in MODULES.items():
        own = layer_of(module)
        for target, line in imports(path, top_level_only=False):
            rank = layer_of(target)
            if own is not None and rank is not None and rank > own:
                wrong.append(f"{path.relative_to(ROOT)}:{line} ({LAYERS[own]}) imports {target}")
    assert wrong == []


def test_nothing_in_cic_imports_flows_or_tasks_when_imported() -> None:
    wrong = [f"{path.relative_to(ROOT)}:{line} imports {target}" for module, path in MODULES.items()
             if module.split(".")[0] == "cic"
             for target, line in imports(path, top_level_only=True) if target.split(".")[0] in ("flows", "tasks")]
    assert wrong == []


def test_the_pipeline_logic_imports_no_service() -> None:
    wrong = [f"{path.relative_to(ROOT)}:{line} imports {target}" for module, path in MODULES.items()
             if layer_of(module) == LAYERS.index("cic.pipeline")
             for target, line in imports(path, top_level_only=False) if target.split(".")[0] in SERVICES]
    assert wrong == []


def test_tasks_hold_prefect_tasks_only() -> None:
    """Every module in tasks/ defines a Prefect task (adapters live in cic/services)."""
    bare = [path.name for module, path in MODULES.items() if module.startswith("tasks.")
            and "@task(" not in path.read_text()]
    assert bare == []


def defined_names(path: Path) -> set[str]:
    """The names a module's own top level defines: functions, classes and assigned names (not imports)."""
    names: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {target.id for target in node.targets if isinstance(target, ast.Name)}
    return names


def test_a_flow_imports_from_a_task_module_only_what_it_defines() -> None:
    """No detour: what a flow takes from `tasks.*` is a name defined there (a task, or its own helper), never a cic
    type or service re-exported through it — those a flow imports from cic itself."""
    detours = [f"{module}:{node.lineno} {alias.name} from {node.module}"
               for module, path in MODULES.items() if module.startswith("flows.")
               for node in ast.walk(ast.parse(path.read_text()))
               if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("tasks.")
               for alias in node.names if alias.name not in defined_names(MODULES[node.module])]
    assert detours == []


def test_no_import_cycle() -> None:
    graph = {m: sorted({t for t, _ in imports(p, top_level_only=False) if t in MODULES and t != m})
             for m, p in MODULES.items()}
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for nxt in graph[node]:
            if state.get(nxt) == 1:
                cycles.append(trail[trail.index(nxt):] + [nxt] if nxt in trail else [node, nxt])
            elif nxt not in state:
                visit(nxt, [*trail, nxt])
        state[node] = 2

    for module in graph:
        if module not in state:
            visit(module, [module])
    # a package importing its own submodule (cic.cli -> cic.cli.stats) is how packages work, not a cycle
    real = [c for c in cycles if not all(c[i + 1].startswith(c[i] + ".") or c[i].startswith(c[i + 1] + ".")
                                         for i in range(len(c) - 1))]
    assert real == []


STATS_CORE = ("cic", *[m for m in MODULES if m.startswith("cic.stats")])


def frameworks_loaded_by(targets: Sequence[str]) -> str:
    """The heavy frameworks a fresh interpreter holds after importing `targets` (comma-separated, "" if none)."""
    code = f"import sys, {', '.join(targets)}; print(','.join(m for m in {HEAVY!r} if m in sys.modules))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def test_importing_the_statistics_core_loads_no_framework() -> None:
    """`import cic` and every cic.stats module stay instant and serving-safe. All of them in one fresh interpreter
    (an import only adds modules, so none alone loads a framework either — one process, not one per module); on a
    failure each is imported alone to name the culprit."""
    together = frameworks_loaded_by(STATS_CORE)
    culprits = {t: f for t in STATS_CORE if (f := frameworks_loaded_by([t]))} if together else {}
    assert together == "", f"the statistics core imported {together}: {culprits or 'only together'}"


SQL_CALLS = ("sql", "sql_frame", "upsert_select", "execute", "executemany", "_scalar")
# MLflow's own SQLite file (not the DuckDB store): its adapter rewrites moved artifact locations in one transaction
FOREIGN_SQL = {"cic/services/mlflow_artifacts.py"}


def sql_calls_outside_the_store(paths: list[Path]) -> list[str]:
    """Calls that run SQL (`.sql(`, `.execute(`, ...) or open DuckDB outside cic/store/."""
    found = []
    for path in paths:
        where = str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else path.name
        if where.startswith("cic/store/") or where in FOREIGN_SQL:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            func = node.func if isinstance(node, ast.Call) else None
            if isinstance(func, ast.Attribute) and (func.attr in SQL_CALLS or (
                    func.attr == "connect" and isinstance(func.value, ast.Name) and func.value.id == "duckdb")):
                found.append(f"{where}:{node.lineno} .{func.attr}(")
    return found


def test_every_sql_statement_lives_in_the_store() -> None:
    scripts = sorted((ROOT / "infra").rglob("*.py"))
    assert sql_calls_outside_the_store([*MODULES.values(), *scripts]) == []


def test_the_sql_rule_sees_a_query_outside_the_store(tmp_path: Path) -> None:
    sample = tmp_path / "bad.py"
    sample.write_text("import duckdb\ndef f(store):\n    store.sql('SELECT 1')\n    duckdb.connect('x.duckdb')\n")
    assert sql_calls_outside_the_store([sample]) == ["bad.py:3 .sql(", "bad.py:4 .connect("]


POSITIONAL_INSERT = re.compile(r"INSERT INTO\s+(?:\{[^}]+\}|\w+)\w*\s+(?!\(|BY NAME)", re.IGNORECASE)


def positional_inserts(files: list[Path]) -> list[str]:
    """`file:line` of each INSERT that names no columns (neither a column list nor BY NAME): a column added or
    reordered in cic.schema would then fill the wrong column without an error."""
    found = []
    for path in files:
        text = path.read_text()
        found += [f"{path.name}:{text.count(chr(10), 0, m.start()) + 1}" for m in POSITIONAL_INSERT.finditer(text)]
    return found


def test_every_insert_names_its_columns() -> None:
    assert positional_inserts(list(MODULES.values())) == []


def test_the_insert_rule_sees_a_positional_insert(tmp_path: Path) -> None:
    sample = tmp_path / "bad.py"
    sample.write_text('a = f"INSERT INTO {t}__new SELECT 1"\nb = "INSERT INTO v VALUES (1)"\n'
                      'c = "INSERT INTO v (x) VALUES (1)"\nd = f"INSERT INTO {t} BY NAME SELECT 1"\n')
    assert positional_inserts([sample]) == ["bad.py:1", "bad.py:2"]


# a concrete engine (every module the engine registry names) and the code only it runs: named inside
# cic/llm/engines (and by its own modules) only
REGISTERED_ENGINES = tuple(sorted({entry.partition(":")[0] for entry in ENGINES.values()}))
CONCRETE_ENGINES = (*REGISTERED_ENGINES, "cic.llm.endpoint", "cic.llm.generation.AnswerGenerator",
                    "cic.llm.models.load_causal_lm")
ENGINE_HOMES = ("cic.llm.engines", "cic.llm.endpoint", "cic.llm.generation", "cic.llm.models")


def test_nothing_outside_the_engines_names_a_concrete_engine() -> None:
    """A new backend is one module in cic/llm/engines and one registry line: the pipeline, tasks, flows and CLI
    reach every engine through `cic.llm.engines` (its interface and registry)."""
    named = [f"{module}:{line} imports {target}" for module, path in MODULES.items()
             if not module.startswith(ENGINE_HOMES)
             for target, line in imports(path, top_level_only=False)
             if any(target == c or target.startswith(c + ".") for c in CONCRETE_ENGINES)]
    assert named == []
    assert REGISTERED_ENGINES and all(m.startswith("cic.llm.engines.") for m in REGISTERED_ENGINES)
    for name in ENGINES:
        assert issubclass(engine_class(name), Engine) and engine_class(name).name == name


def test_the_engine_registry_refuses_an_entry_that_is_not_an_engine_of_its_name() -> None:
    """A registry line pointing at another class (or at an engine registered under another name) is one line naming
    it, not an AttributeError deep in a worker."""
    ENGINES.register("cic.stats.bounds:Bound", name="not-an-engine")
    ENGINES.register("cic.llm.engines.local:LocalEngine", name="renamed")
    try:
        for name in ("not-an-engine", "renamed"):
            with pytest.raises(UserError, match=f"engine '{name}': the registry names"):
                engine_class(name)
    finally:
        for name in ("not-an-engine", "renamed"):
            ENGINES._entries.pop(name)


# the rooms of cic/pipeline, lowest first (config and alerts, the shared values, sit beside them at its top)
PIPELINE_ROOMS = ("run", "gates", "production")


def test_the_pipelines_rooms_never_import_a_higher_room() -> None:
    """run/ (a run and its stored calibration) < gates/ (certify, serve, lifecycle) < production/ (ingest,
    recalibration, monitoring): no import back up, in function bodies either."""
    rank = {room: i for i, room in enumerate(PIPELINE_ROOMS)}
    assert {p.name for p in (ROOT / "cic/pipeline").iterdir() if p.is_dir() and p.name in rank} == set(rank)
    upward = [f"{module}:{line} imports {target}" for module, path in MODULES.items()
              if module.startswith("cic.pipeline.") and module.split(".")[2] in rank
              for target, line in imports(path, top_level_only=False)
              if target.startswith("cic.pipeline.") and target.split(".")[2] in rank
              and rank[target.split(".")[2]] > rank[module.split(".")[2]]]
    assert upward == []
