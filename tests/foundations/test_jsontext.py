"""`jsontext.compact_json` gives exactly what `json.dumps` gives with the same options."""

from __future__ import annotations

import datetime
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from atmosphere_harness._jsontext import compact_json

# Text with lone surrogates, control characters and non-ASCII; numbers with NaN and infinities.
scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(alphabet=st.characters(codec=None, exclude_categories=()), max_size=40)
)
documents = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=5)
        | st.dictionaries(st.text(max_size=8), inner, max_size=5)
        | st.tuples(inner, inner)
    ),
    max_leaves=30,
)


@given(documents)
@pytest.mark.parametrize("ascii_only", [True, False])
@pytest.mark.parametrize("check_circular", [True, False])
def test_the_text_is_json_dumps_text(ascii_only: bool, check_circular: bool, value: Any) -> None:
    encode = compact_json(ascii_only=ascii_only, default=str, check_circular=check_circular)
    expected = json.dumps(value, ensure_ascii=ascii_only, separators=(",", ":"), default=str)
    assert encode(value) == expected


def test_default_turns_what_json_lacks_into_text() -> None:
    moment = datetime.date(2026, 12, 5)
    assert compact_json(default=str)({"on": moment}) == '{"on":"2026-12-05"}'


def test_without_default_what_json_lacks_is_a_type_error_as_with_json_dumps() -> None:
    with pytest.raises(TypeError, match="not JSON serializable"):
        compact_json()({"x": object()})


def test_a_document_that_contains_itself_is_refused_and_the_encoder_still_works() -> None:
    encode = compact_json()
    loop: list[Any] = []
    loop.append(loop)
    with pytest.raises(ValueError, match="Circular reference"):
        encode(loop)
    shared = [1]
    assert encode([shared, shared]) == "[[1],[1]]"  # a repeat is not a cycle
