"""pp.convert tells Python callers what it left out of the source, as the command line does."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

import policyport as pp
from policyport.converter import convert_source

ROOT = Path(__file__).resolve().parents[2]
SB3 = ROOT / "fixtures/sb3/ppo_pendulum.zip"
VALUE_LEFT_OUT = "the value function (mlp_extractor.value_net, value_net) is not exported"


def test_a_dropped_value_function_is_a_conversion_note_warning():
    with pytest.warns(pp.ConversionNote) as caught:
        model = pp.convert(str(SB3))
    messages = [str(w.message) for w in caught if w.category is pp.ConversionNote]
    assert messages == convert_source(str(SB3)).notes
    assert len(messages) == 1 and messages[0].startswith(VALUE_LEFT_OUT)
    assert caught[0].filename == __file__  # points at the caller's line, not policyport's
    assert "value" not in [o.name for o in model.graph.output]


def test_nothing_left_out_warns_nothing():
    with warnings.catch_warnings():
        warnings.simplefilter("error", pp.ConversionNote)
        model = pp.convert(str(SB3), keep_value=True)
    assert "value" in [o.name for o in model.graph.output]


def test_conversion_notes_can_be_silenced_by_category():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warnings.filterwarnings("ignore", category=pp.ConversionNote)
        pp.convert(str(SB3))
    assert not [w for w in caught if issubclass(w.category, pp.ConversionNote)]
    assert issubclass(pp.ConversionNote, UserWarning)
