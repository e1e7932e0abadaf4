"""Hostile files, the same way through all four harness readers (`cic.store.harness.contract`): a truncated file, a
question recorded twice with the other label, a log-likelihood that is not a log-probability, an unfinished
evaluation, a field of the wrong type and a symbolic link looping on itself are each refused in one line naming the
file — never kept in silence, never a traceback; the installed `cic convert` exits 2 with that line."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import polars as pl
import pytest

from cic.errors import UserError
from cic.store.harness import read_harness

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
CIC = Path(sys.executable).parent / "cic"


def _lm_eval(tmp: Path) -> tuple[Path, Path]:
    """(what a reader is given, the file a case edits): lm-eval's multiple-choice samples file."""
    folder = shutil.copytree(FIXTURES / "lm_eval" / "SmolLM2-135M-Instruct", tmp / "lm_eval")
    return folder, next(folder.glob("samples_*.jsonl"))


def _lighteval(tmp: Path) -> tuple[Path, Path]:
    root = shutil.copytree(FIXTURES / "lighteval" / "results", tmp / "lighteval")
    details = next(root.glob("details/models/SmolLM2-135M-Instruct/*/details_*mc*.parquet"))
    for other in root.glob("details/**/details_*gen*.parquet"):
        other.unlink()
    return details, details


def _helm(tmp: Path) -> tuple[Path, Path]:
    run = next((FIXTURES / "helm" / "runs" / "v4").iterdir())
    copy = shutil.copytree(run, tmp / "helm" / "run")
    return copy.parent, copy / "scenario_state.json"


def _inspect(tmp: Path) -> tuple[Path, Path]:
    log = tmp / "inspect" / "log.json"
    log.parent.mkdir(parents=True)
    shutil.copy(FIXTURES / "inspect_ai" / "cic_triviaqa.json", log)
    return log, log


def _jsonl(edit: Callable[[list[dict]], list[dict]]) -> Callable[[Path], None]:
    def apply(path: Path) -> None:
        records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        path.write_text("".join(json.dumps(r) + "\n" for r in edit(records)))
    return apply


def _json(edit: Callable[[dict], None]) -> Callable[[Path], None]:
    def apply(path: Path) -> None:
        document = json.loads(path.read_text())
        edit(document)
        path.write_text(json.dumps(document))
    return apply


def _parquet(edit: Callable[[list[dict]], list[dict]]) -> Callable[[Path], None]:
    def apply(path: Path) -> None:
        frame = pl.read_parquet(path)
        pl.DataFrame(edit(frame.to_dicts()), schema=frame.schema).write_parquet(path)
    return apply


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[:len(data) // 2])


def _flipped_lm_eval(record: dict) -> dict:
    return {**record, **{m: 1 - record[m] for m in record["metrics"]}}


def _lm_eval_ll(value: str) -> Callable[[Path], None]:
    def edit(records: list[dict]) -> list[dict]:
        records[0]["filtered_resps"][0][0] = value
        return records
    return _jsonl(edit)


def _lighteval_ll(value: float) -> Callable[[Path], None]:
    def edit(rows: list[dict]) -> list[dict]:
        rows[0]["model_response"]["logprobs"][0] = value
        return rows
    return _parquet(edit)


def _flipped_lighteval(row: dict) -> dict:
    return {**row, "metric": {k: (1 - v if v in (0, 1) else v) for k, v in row["metric"].items()}}


def _helm_ll(value: float) -> Callable[[Path], None]:
    def edit(state: dict) -> None:
        state["request_states"][0]["result"]["completions"][0]["tokens"][0]["logprob"] = value
    return _json(edit)


def _flipped_inspect(sample: dict) -> dict:
    return {**sample, "scores": {k: ({**v, "value": "I" if v.get("value") == "C" else "C"} if isinstance(v, dict)
                                     else v) for k, v in (sample.get("scores") or {}).items()}}


READERS = {"lm-eval": _lm_eval, "lighteval": _lighteval, "helm": _helm, "inspect-ai": _inspect}
CASES: dict[str, dict[str, tuple[Callable[[Path], None], str]]] = {
    "lm-eval": {
        "truncated": (_truncate, "is not JSON"),
        "duplicated, the other label": (_jsonl(lambda rs: [*rs, _flipped_lm_eval(rs[0])]), "appears again"),
        "log-likelihood nan": (_lm_eval_ll("nan"), "is not a log-probability"),
        "log-likelihood inf": (_lm_eval_ll("inf"), "is not a log-probability"),
        "log-likelihood +50": (_lm_eval_ll("50.0"), "is not a log-probability"),
        "log-likelihood 1e308": (_lm_eval_ll("1e308"), "is not a log-probability"),
        "a record that is a list": (_jsonl(lambda rs: [rs[0], [1, 2], *rs[2:]]), "not an lm-eval sample record"),
        "metrics of the wrong type": (_jsonl(lambda rs: [{**rs[0], "metrics": 7}, *rs[1:]]), "metrics = 7"),
    },
    "lighteval": {
        "truncated": (_truncate, "not a Parquet file"),
        "duplicated, the other label": (_parquet(lambda rs: [*rs, _flipped_lighteval(rs[0])]), "appears again"),
        "log-likelihood nan": (_lighteval_ll(math.nan), "is not a log-probability"),
        "log-likelihood inf": (_lighteval_ll(math.inf), "is not a log-probability"),
        "log-likelihood +50": (_lighteval_ll(50.0), "is not a log-probability"),
        "a doc without an id": (_parquet(lambda rs: [{**rs[0], "doc": {**rs[0]["doc"], "id": None}}, *rs[1:]]),
                                "no doc.id"),
    },
    "helm": {
        "truncated": (_truncate, "not a JSON document"),
        "duplicated": (_json(lambda s: s["request_states"].append(s["request_states"][0])), "appears again"),
        "token log-probability nan": (_helm_ll(math.nan), "is not a log-probability"),
        "token log-probability +50": (_helm_ll(50.0), "is not a log-probability"),
        "a result of the wrong type": (_json(lambda s: s["request_states"][0].update(result=5)), "not well-formed"),
    },
    "inspect-ai": {
        "truncated": (_truncate, "not a JSON document"),
        "duplicated, the other label": (_json(lambda d: d["samples"].append(_flipped_inspect(d["samples"][0]))),
                                        "appears again"),
        "stopped with an error": (_json(lambda d: d.update(status="error", error={"message": "CUDA out of memory"})),
                                  "status = 'error': the evaluation did not finish"),
        "an output of the wrong type": (_json(lambda d: d["samples"][0].update(output=5)), "not well-formed"),
    },
}


@pytest.mark.faults
@pytest.mark.parametrize(("reader", "case"), [(r, c) for r, cases in CASES.items() for c in cases])
def test_every_reader_refuses_a_hostile_file_in_one_line_naming_it(tmp_path: Path, reader: str, case: str) -> None:
    given, edited = READERS[reader](tmp_path)
    edit, words = CASES[reader][case]
    edit(edited)
    with pytest.raises(UserError) as caught:
        read_harness(given, reader)
    message = str(caught.value)
    assert "\n" not in message and str(edited.parent.name) in message, message
    assert any(w in message for w in words.split("|")), message


@pytest.mark.faults
@pytest.mark.parametrize("reader", list(READERS))
def test_a_symbolic_link_looping_on_itself_is_one_line_for_every_reader(tmp_path: Path, reader: str) -> None:
    loop = tmp_path / f"{reader}-loop.json"
    loop.symlink_to(loop)
    with pytest.raises(UserError, match="a symbolic link that leads nowhere"):
        read_harness(loop, reader)


@pytest.mark.faults
def test_the_installed_cic_convert_refuses_a_hostile_file_with_exit_2_and_one_line(tmp_path: Path) -> None:
    given, edited = _helm(tmp_path)
    CASES["helm"]["a result of the wrong type"][0](edited)
    done = subprocess.run([str(CIC), "convert", str(given), "--out", str(tmp_path / "out.parquet")],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "not well-formed" in done.stderr
    assert not (tmp_path / "out.parquet").exists()


@pytest.mark.slow  # four harness outputs scored (two by sampling estimators) and benchmarked, two logged
def test_cic_bench_and_cic_log_read_every_harness_output_the_readme_lists(tmp_path: Path) -> None:
    """`cic bench` takes each reader's output as it is (no `cic convert` first) and `cic log` a HELM run folder and
    an lm-eval folder, as the installed command runs them."""
    outputs = {name: READERS[name](tmp_path)[0] for name in READERS}
    done = subprocess.run([str(CIC), "bench", *map(str, outputs.values()), "--n-splits", "10", "--alphas", "0.25",
                           "--methods", "cic"], capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    for model in ("SmolLM2-135M-Instruct", "meta/llama-3-8b-chat"):
        assert model in done.stdout
    for name in ("helm", "lm-eval"):
        logged = subprocess.run([str(CIC), "log", str(outputs[name]), "--tracking-uri",
                                 f"sqlite:///{tmp_path / 'mlflow.db'}", "--n-splits", "10"],
                                capture_output=True, text=True, timeout=600, cwd=tmp_path)
        assert logged.returncode == 0, logged.stderr[-2000:]
        assert "group(s) logged" in " ".join(logged.stdout.split())
