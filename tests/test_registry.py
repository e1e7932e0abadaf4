"""The one registry type: lookup by name (case, spaces, aliases), one error text, entries of one's own."""

from __future__ import annotations

import pytest

from cic.errors import UserError
from cic.registry import Registry
from cic.stats.bounds import BOUNDS, get_bound
from cic.stats.searches import SEARCHES, get_search


def test_lookup_ignores_case_and_spaces_resolves_aliases_and_names_the_choices() -> None:
    registry = Registry("criterion", {"option_match": None, "token_f1": 0.5}, hint="token_f1 takes a threshold")
    registry.alias("f1", to="token_f1")
    assert registry.lookup(" Token_F1 ") == 0.5 and registry.lookup("F1") == 0.5
    assert registry.lookup("option_match") is None and "option_match" in registry  # a None entry is an entry
    assert "exact" not in registry and registry.find("exact") is None and registry.get("exact") is None
    with pytest.raises(UserError) as refused:
        registry.lookup("exact")
    assert str(refused.value) == ("criterion = 'exact': unknown; choose one of option_match, token_f1 (aliases: f1) "
                                  "(token_f1 takes a threshold)")
    with pytest.raises(UserError, match="criterion = 3: unknown"):
        registry.lookup(3)


def test_an_entry_of_ones_own_is_registered_once_and_a_copy_is_independent() -> None:
    registry = Registry("search", SEARCHES)
    mine = get_search("paper")
    registry.register(mine, name="my_paper")
    assert registry.lookup("MY_PAPER") is mine and "my_paper" not in SEARCHES
    with pytest.raises(UserError, match="search 'my_paper' is already registered; pass replace=True"):
        registry.register(mine, name="my_paper")
    copy = registry.copy()
    copy.register(mine, name="other")
    assert "other" in copy and "other" not in registry and list(copy)[:len(registry)] == list(registry)


def test_the_project_registries_are_registries_with_one_error_text() -> None:
    assert isinstance(BOUNDS, Registry) and get_bound("Clopper-Pearson").name == "cp"
    with pytest.raises(UserError, match=r"^bound = 'x': unknown; choose one of hoeffding, cp"):
        get_bound("x")
