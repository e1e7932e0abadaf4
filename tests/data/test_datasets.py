"""Dataset loaders: bundled samples, the shared full copies, hub layouts (JSONL, Parquet shards), the registry,
subsampling and the errors for bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cic import schema
from cic.data import DATASETS, DatasetSourceError, DatasetSpec, build_prompt, load_questions, open_ended_fields
from cic.data.bundle import write_samples
from cic.data.prompts import SHORT_ANSWER_V1
from cic.data.sources import sample_path
from cic.errors import UserError

SHARED = Path(os.environ.get("CIC_SHARED_DATA", "/work/shared/data"))
needs_shared = pytest.mark.skipif(not SHARED.is_dir(), reason=f"shared data directory {SHARED} not present")
CSQA_FULL = SHARED / "commonsense_qa" / "commonsense_qa_validation.jsonl"
TQA_FULL = SHARED / "trivia_qa" / "triviaqa_rc_nocontext_validation_first4000_ascii.jsonl"
ROOT = Path(__file__).resolve().parents[2]


def csqa_record(qid: str, answer: str = "B", **changes: object) -> dict:
    record = {"id": qid, "question": f"Where is {qid}?", "question_concept": "x",
              "choices": {"label": list("ABCDE"), "text": ["a", "b", "c", "d", "e"]}, "answerKey": answer}
    record.update(changes)
    return record


def trivia_hub_record(qid: str, value: str, aliases: list[str]) -> dict:
    """The full TriviaQA rc.nocontext record as the hub's Parquet shards hold it."""
    return {"question": f"Question {qid}?", "question_id": qid, "question_source": "http://www.triviaquiz.com/",
            "entity_pages": {"doc_source": [], "filename": [], "title": [], "wiki_context": []},
            "search_results": {"description": [], "filename": [], "rank": [], "title": [], "url": [],
                               "search_context": []},
            "answer": {"aliases": aliases, "normalized_aliases": [a.lower() for a in aliases],
                       "matched_wiki_entity_name": "", "normalized_matched_wiki_entity_name": "",
                       "normalized_value": value.lower(), "type": "WikipediaEntity", "value": value}}


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


# ----------------------------------------------------------------------------------------------------------
# Bundled samples and the shared copies


def test_bundled_samples_load_in_the_questions_layout() -> None:
    csqa = load_questions("commonsense_qa")
    tqa = load_questions("trivia_qa")
    assert csqa.height == 300 and tqa.height == 300
    for frame, name in ((csqa, "commonsense_qa"), (tqa, "trivia_qa")):
        assert frame.schema == schema.QUESTIONS.schema
        assert frame["dataset"].unique().to_list() == [name]
        assert frame["split"].unique().to_list() == ["validation"]
        assert frame["question_id"].n_unique() == frame.height
        assert frame["question"].str.len_chars().min() > 0
    assert csqa["choices"].list.len().unique().to_list() == [5]
    assert all(row["answer"] in row["choice_labels"] for row in csqa.iter_rows(named=True))
    assert tqa["choices"].null_count() == tqa.height
    assert tqa["aliases"].list.len().max() == 0  # the bundled copy carries no aliases


def test_bundled_samples_ship_with_an_attribution_note() -> None:
    note = sample_path("README.md").read_text()
    assert "MIT" in note and "Talmor" in note and "Joshi" in note and "unknown" in note


@needs_shared
def test_bundled_samples_are_the_deterministic_choice_from_the_shared_files(tmp_path: Path) -> None:
    for written in write_samples(SHARED, tmp_path):
        assert written.read_bytes() == sample_path(written.name).read_bytes(), written.name


@needs_shared
def test_loaders_read_the_full_shared_files_and_directories() -> None:
    csqa = load_questions("commonsense_qa", CSQA_FULL)
    assert csqa.height == 1221
    first = csqa.row(0, named=True)
    assert first["question_id"] == "1afa02df02c908a558b4036e80242fac"
    assert first["choices"] == ["bank", "library", "department store", "mall", "new york"]
    assert first["choice_labels"] == list("ABCDE") and first["answer"] == "A" and first["aliases"] == []
    tqa = load_questions("trivia_qa", TQA_FULL.parent)  # a directory works too
    assert tqa.height == 4000
    assert tqa.row(0, named=True)["answer"] == "David Seville"
    sample_ids = set(load_questions("trivia_qa")["question_id"])
    assert sample_ids <= set(tqa["question_id"])


def test_limit_and_seed_subsample_deterministically_in_source_order() -> None:
    full = load_questions("trivia_qa")
    head = load_questions("trivia_qa", limit=10)
    assert head["question_id"].to_list() == full["question_id"].head(10).to_list()
    a = load_questions("trivia_qa", limit=25, seed=7)
    b = load_questions("trivia_qa", limit=25, seed=7)
    c = load_questions("trivia_qa", limit=25, seed=8)
    assert a.equals(b) and not a.equals(c)
    positions = [full["question_id"].to_list().index(q) for q in a["question_id"]]
    assert positions == sorted(positions) and positions != list(range(25))
    assert load_questions("trivia_qa", limit=10_000).height == 300
    for small, large in ((8, 9), (25, 60)):  # a larger limit extends the sample a smaller one drew
        kept = set(load_questions("trivia_qa", limit=large, seed=7)["question_id"])
        assert set(load_questions("trivia_qa", limit=small, seed=7)["question_id"]) < kept
    with pytest.raises(UserError, match="limit = 0"):
        load_questions("trivia_qa", limit=0)


# ----------------------------------------------------------------------------------------------------------
# Hub layouts: the full TriviaQA record, Parquet shards, JSON arrays


def test_parquet_shards_in_the_hub_layout_with_answer_aliases(tmp_path: Path) -> None:
    shard_dir = tmp_path / "trivia_qa" / "rc.nocontext"
    shard_dir.mkdir(parents=True)
    validation = [trivia_hub_record("tc_1", "David Seville", ["David Seville", "Ross Bagdasarian", "david seville",
                                                               "Ross Bagdasarian"]),
                  trivia_hub_record("tc_2", "Sunset Boulevard", []),
                  trivia_hub_record("tc_3", "Paris", ["Paris", "Paris, France"])]
    pq.write_table(pa.Table.from_pylist(validation[:2]), shard_dir / "validation-00000-of-00002.parquet")
    pq.write_table(pa.Table.from_pylist(validation[2:]), shard_dir / "validation-00001-of-00002.parquet")
    pq.write_table(pa.Table.from_pylist([trivia_hub_record("tc_9", "x", [])]),
                   shard_dir / "train-00000-of-00001.parquet")
    other_config = tmp_path / "trivia_qa" / "unfiltered.nocontext"
    other_config.mkdir()
    pq.write_table(pa.Table.from_pylist([trivia_hub_record("u_1", "y", [])]),
                   other_config / "validation-00000-of-00001.parquet")

    frame = load_questions("trivia_qa", tmp_path / "trivia_qa")
    assert frame["question_id"].to_list() == ["tc_1", "tc_2", "tc_3"]  # validation shards of rc.nocontext only
    rows = frame.rows_by_key("question_id", named=True, unique=True)
    assert rows["tc_1"]["answer"] == "David Seville"
    assert rows["tc_1"]["aliases"] == ["Ross Bagdasarian", "david seville"]
    assert rows["tc_2"]["aliases"] == [] and rows["tc_3"]["aliases"] == ["Paris, France"]
    train = load_questions("trivia_qa", tmp_path / "trivia_qa", split="train")
    assert train["question_id"].to_list() == ["tc_9"] and train["split"].to_list() == ["train"]


def test_full_trivia_record_as_jsonl_and_commonsense_parquet_and_json_array(tmp_path: Path) -> None:
    tqa = load_questions("trivia_qa", write_jsonl(tmp_path / "t.jsonl",
                                                  [trivia_hub_record("q1", "Mars", ["Mars", "Red planet"])]))
    assert tqa.row(0, named=True)["aliases"] == ["Red planet"]
    parquet = tmp_path / "validation-00000-of-00001.parquet"
    pq.write_table(pa.Table.from_pylist([csqa_record("c1", "D"), csqa_record("c2", "E")]), parquet)
    csqa = load_questions("commonsense_qa", parquet)
    assert csqa["answer"].to_list() == ["D", "E"] and csqa.row(0, named=True)["choices"] == list("abcde")
    array = tmp_path / "records.json"
    array.write_text(json.dumps([csqa_record("c3")]))
    assert load_questions("commonsense_qa", array)["question_id"].to_list() == ["c3"]


# ----------------------------------------------------------------------------------------------------------
# Bad input: clear errors naming the row and the field


@pytest.mark.parametrize("records,message", [
    ([csqa_record("c1"), {k: v for k, v in csqa_record("c2").items() if k != "answerKey"}],
     r"line 2 of 'bad.jsonl' \(id 'c2'\): field 'answerKey' is missing or empty"),
    ([csqa_record("c1", question="  ")], r"line 1 .*field 'question' is missing or empty"),
    ([csqa_record("c1", answer="F")], r"field 'answerKey' = 'F' is not one of the option labels A, B, C, D, E"),
    ([csqa_record("c1", choices={"label": list("ABC"), "text": ["a", "b"]})],
     r"field 'choices.label' has 3 labels for 2 options"),
    ([csqa_record("c1"), csqa_record("c2"), csqa_record("c1")],
     r"duplicate question_id 'c1' at line 1 of 'bad.jsonl' and line 3 of 'bad.jsonl'"),
])
def test_bad_records_name_the_row_and_the_field(tmp_path: Path, records: list[dict], message: str) -> None:
    with pytest.raises(UserError, match=message):
        load_questions("commonsense_qa", write_jsonl(tmp_path / "bad.jsonl", records))


def test_bad_sources_give_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(DatasetSourceError, match="no such file or directory"):
        load_questions("trivia_qa", tmp_path / "missing.jsonl")
    with pytest.raises(UserError, match="dataset = 'squad': unknown; choose one of commonsense_qa, "
                                         "trivia_qa"):
        load_questions("squad")
    (tmp_path / "empty.jsonl").write_text("\n\n")
    with pytest.raises(DatasetSourceError, match="holds no records"):
        load_questions("trivia_qa", tmp_path / "empty.jsonl")
    (tmp_path / "broken.jsonl").write_text('{"question_id": "a", "question": "q", "answer": "x"}\n{"oops"\n')
    with pytest.raises(DatasetSourceError, match="line 2 of .* is not valid JSON"):
        load_questions("trivia_qa", tmp_path / "broken.jsonl")
    (tmp_path / "data.csv").write_text("a,b\n")
    with pytest.raises(DatasetSourceError, match="unsupported file type '.csv'"):
        load_questions("trivia_qa", tmp_path / "data.csv")
    (tmp_path / "nothing").mkdir()
    with pytest.raises(DatasetSourceError, match="holds no"):
        load_questions("trivia_qa", tmp_path / "nothing")
    with pytest.raises(DatasetSourceError, match="no such file or directory"):
        load_questions("trivia_qa", "typo/path.jsonl")
    with pytest.raises(DatasetSourceError, match="validation rows only"):
        load_questions("trivia_qa", "sample", split="train")


def test_hub_unreachable_is_a_clear_error_with_the_offline_alternatives(tmp_path: Path) -> None:
    """The real `datasets.load_dataset` path, with the hub switched off (what a machine without internet sees)."""
    code = ("from cic.data import load_questions\n"
            "try:\n    load_questions('commonsense_qa', 'hub')\n"
            "except ValueError as exc:\n    print('ERROR', exc)\n")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "PYTHONPATH": str(ROOT),
           "HF_HOME": str(tmp_path / "hf-home")}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "ERROR cannot load hub dataset 'tau/commonsense_qa' split 'validation'" in proc.stdout
    assert "bundled sample" in proc.stdout


@pytest.mark.slow
def test_hub_id_source_fails_clearly_without_network(tmp_path: Path) -> None:
    """A hub id given as source goes through `datasets.load_dataset` for real; with no network (the hub's offline
    switch: the same failure without huggingface_hub's 24 s of retries, and never a download where the hub is
    reachable) and no cache it must fail in one clear sentence that names the way out."""
    code = ("from cic.data import load_questions\n"
            "try:\n    load_questions('trivia_qa', 'mandarjoshi/trivia_qa')\n"
            "except ValueError as exc:\n    print('ERROR', exc)\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HOME": str(tmp_path / "hf-home"), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "cannot load hub dataset 'mandarjoshi/trivia_qa' config 'rc.nocontext'" in proc.stdout
    assert "use the bundled sample (source 'sample') or a local JSONL/Parquet copy" in proc.stdout


# ----------------------------------------------------------------------------------------------------------
# The registry: a third dataset by one small entry


def test_a_users_own_dataset_is_one_registry_entry(tmp_path: Path) -> None:
    data = write_jsonl(tmp_path / "capitals.jsonl", [
        {"id": 1, "q": "What is the capital of France?", "a": "Paris", "also": ["paris", "Paris"]},
        {"id": 2, "q": "What is the capital of Japan?", "a": "Tokyo", "also": []}])
    registry = DATASETS.copy()
    registry.register(DatasetSpec(name="capitals", parse=open_ended_fields(question_id="id", question="q",
                                                                           answer="a", aliases="also"),
                                  prompt=SHORT_ANSWER_V1, default_source=str(data)))
    frame = load_questions("capitals", registry=registry)
    assert frame["question_id"].to_list() == ["1", "2"] and frame["dataset"].unique().to_list() == ["capitals"]
    assert frame.row(0, named=True)["aliases"] == ["paris"]
    prompt = build_prompt(frame.row(1, named=True), registry=registry)
    assert prompt.endswith("Question: What is the capital of Japan?\nAnswer:")
    assert "capitals" not in DATASETS  # the default registry is untouched
    with pytest.raises(UserError, match="already registered"):
        registry.register(DatasetSpec(name="capitals", parse=open_ended_fields(), prompt=SHORT_ANSWER_V1))


def test_a_dataset_from_a_config_entry(tmp_path: Path) -> None:
    data = write_jsonl(tmp_path / "mc.jsonl", [{"key": "m1", "text": "2 + 2 = ?", "options": ["3", "4"],
                                                "gold": "B"}])
    registry = DATASETS.copy()
    registry.register_config({"name": "arith", "kind": "multiple_choice", "path": str(data),
                              "fields": {"question_id": "key", "question": "text", "choices": "options",
                                         "answer": "gold"}})
    row = load_questions("arith", registry=registry).row(0, named=True)
    assert row["choices"] == ["3", "4"] and row["choice_labels"] == ["A", "B"] and row["answer"] == "B"
    assert build_prompt(row, registry=registry).endswith("Question: 2 + 2 = ?\nA. 3\nB. 4\nAnswer:")
    with pytest.raises(UserError, match="kind = 'ranking'"):
        registry.register_config({"name": "x", "kind": "ranking"})
    with pytest.raises(UserError, match="fields choices do not apply to kind 'open'"):
        registry.register_config({"name": "y", "fields": {"choices": "c"}})
    with pytest.raises(UserError, match="dataset name = 'a b'"):
        registry.register_config({"name": "a b"})


def test_loaded_questions_conform_to_the_store_layout() -> None:
    frame = load_questions("commonsense_qa", limit=5)
    assert schema.conform(frame, schema.QUESTIONS).equals(frame)
    assert isinstance(frame, pl.DataFrame)


@pytest.mark.slow
def test_samples_ship_inside_the_built_wheel(tmp_path: Path) -> None:
    """Build the wheel from a copy of the project, install it elsewhere, and load the samples from there."""
    import shutil

    project = tmp_path / "project"
    project.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, project / name)
    for package in ("cic", "flows", "tasks"):
        shutil.copytree(ROOT / package, project / package, ignore=shutil.ignore_patterns("__pycache__"))
    wheels, target = tmp_path / "wheels", tmp_path / "site"
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(wheels), str(project)],
                   check=True, capture_output=True, timeout=300)
    (wheel,) = wheels.glob("cic-*.whl")
    subprocess.run([*pip, "install", "--no-deps", "--target", str(target), str(wheel)], check=True,
                   capture_output=True, timeout=300)
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import cic.data; "
            "from cic.data import load_questions; from cic.data.sources import sample_path; "
            "print(cic.data.__file__); print(load_questions('commonsense_qa').height, "
            "load_questions('trivia_qa').height, sample_path('README.md').is_file())")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, "-c", code, str(target)], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr
    location, counts = proc.stdout.strip().splitlines()
    assert location.startswith(str(target)) and counts == "300 300 True"
