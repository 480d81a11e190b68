from atmosphere_harness import Harness

CONCRETE = {Harness.MEMORY, Harness.CACHE, Harness.DELEGATION, Harness.PLANNING, Harness.FILESYSTEM}


def test_all_expands_to_every_concrete_feature() -> None:
    assert Harness.expand([Harness.ALL]) == CONCRETE
    assert Harness.ALL not in Harness.expand([Harness.ALL])
    assert set(Harness.concrete()) == set(Harness) - {Harness.ALL}


def test_duplicates_collapse_and_single_passes_through() -> None:
    assert Harness.expand([Harness.MEMORY, Harness.MEMORY]) == {Harness.MEMORY}
    assert Harness.expand([Harness.ALL, Harness.MEMORY, Harness.ALL]) == CONCRETE
    assert Harness.expand((Harness.PLANNING,)) == {Harness.PLANNING}


def test_empty_and_none_give_empty() -> None:
    assert Harness.expand([]) == frozenset()
    assert Harness.expand(None) == frozenset()
    assert Harness.expand(()) == frozenset()


def test_expand_rejects_non_members() -> None:
    import pytest

    with pytest.raises(TypeError):
        Harness.expand(["memory"])  # type: ignore[list-item]


def test_ordered_follows_declaration_order() -> None:
    assert Harness.ordered({Harness.FILESYSTEM, Harness.MEMORY}) == [
        Harness.MEMORY,
        Harness.FILESYSTEM,
    ]
