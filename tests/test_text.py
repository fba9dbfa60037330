"""Text from files in messages: bounded whatever the value, and as repr writes it when small."""

from __future__ import annotations

import collections

import pytest

from policyport.text import bounded_repr


@pytest.mark.parametrize("value", [
    {"features_dim": 64, "net_arch": [64, 64]},  # a dict's items in their own order
    "<class 'stable_baselines3.common.torch_layers.NatureCNN'>", (1, 2.5, None), [], {}, 3, b"ab",
])
def test_a_small_value_reads_as_repr_writes_it(value):
    assert bounded_repr(value) == repr(value)


def test_a_value_sharing_its_containers_is_never_written_out_as_a_tree():
    value: object = [0]
    for _ in range(60):  # 2**61 lists as a tree
        value = collections.OrderedDict(a=value, b=value)
    shown = bounded_repr(value)
    assert len(shown) < 1000 and shown.startswith("{'a': {'a': {'a': {'a': {...}, 'b': {...}}")
    assert bounded_repr(list(range(100))) == "[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, ...]"
    assert bounded_repr("x" * 1000).count("x") < 310
