"""What a rerun still has to generate: a question with all its rows is done; under adaptive rounds, one whose
first round is stored is done too (a batch stores only questions whose rounds ended)."""

from __future__ import annotations

from pathlib import Path

from cic.store.database import Store
from cic.store.resume import missing_work
from tests.store.test_queries import rows


def test_an_adaptive_question_stored_after_its_first_round_is_not_generated_again(tmp_path: Path) -> None:
    with Store.open(tmp_path / "c.duckdb") as store:
        store.upsert_batches("generations", [rows("r", {"settled": 5, "full": 11, "cut": 2})])
        ids = ["settled", "full", "cut", "new"]
        plain = missing_work(store, "r", ids, n_samples=10, estimators=[], criteria=[])
        adaptive = missing_work(store, "r", ids, n_samples=10, estimators=[], criteria=[], adaptive=(4, 10))
    assert plain.to_generate == ["settled", "cut", "new"]
    assert adaptive.to_generate == ["cut", "new"]
