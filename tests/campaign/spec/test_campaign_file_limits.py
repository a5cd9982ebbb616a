"""Campaign files that would take minutes or memory to validate are refused or checked in linear time."""

from __future__ import annotations

import pytest

from gpufill.campaign.spec.spec import load_campaign
from gpufill.campaign.spec.spec_errors import MAX_VALUES, expanded_size, first_duplicate
from gpufill.errors import InputError

BOMB = """name: bomb
a: &a [x, x, x, x, x, x, x, x, x, x]
b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]
c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b]
d: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c, *c]
e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d, *d]
f: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e, *e]
g: &g [*f, *f, *f, *f, *f, *f, *f, *f, *f, *f]
h: &h [*g, *g, *g, *g, *g, *g, *g, *g, *g, *g]
i: &i [*h, *h, *h, *h, *h, *h, *h, *h, *h, *h]
models: {linear: {}}
seeds: *i
"""


def test_nested_aliases_are_refused_before_anything_walks_them(tmp_path):
    """A few hundred bytes that expand to ten billion values: one line, without expanding them."""
    path = tmp_path / "bomb.yaml"
    path.write_text(BOMB)
    with pytest.raises(InputError) as caught:
        load_campaign(path)
    text = str(caught.value)
    assert text.startswith(f"{path}: its values, aliases expanded, number more than 1,000,000") and "\n" not in text


def test_the_expanded_size_counts_aliases_as_their_expansion():
    import yaml

    # root 1 + key a 1 + [1, 2, 3] 4 + key b 1 + [*x, *x] 1 + 2 x 4
    assert expanded_size(yaml.compose("a: &x [1, 2, 3]\nb: [*x, *x]")) == 16
    assert expanded_size(yaml.compose("\n".join(f"k{i}: {i}" for i in range(100)))) == 201
    assert expanded_size(yaml.compose(BOMB)) > MAX_VALUES


def test_duplicates_are_found_in_linear_time_with_the_same_meaning():
    assert first_duplicate(list(range(300_000)) + [5]) == 300_000
    assert first_duplicate([1, 2, 1.0]) == 2  # 1 == 1.0: the same seed
    assert first_duplicate([1, True]) is None  # a bool is not a number here
    assert first_duplicate([[64, 32], [32], [64, 32]]) == 2  # unhashable values (list-valued parameters) compared too
    assert first_duplicate(["a", [1], "b", (1,)]) is None
    assert first_duplicate(list(range(300_000))) is None
