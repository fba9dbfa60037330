"""The restricted unpickler: arrays and containers come back exactly, framework classes come back as
inert records, and a pickle that would run code is refused before anything runs."""

from __future__ import annotations

import collections
import os
import pickle
import sys
import types

import numpy as np
import pytest

from policyport.converter.unpickle import Record, load, plain
from policyport.errors import UnreadableFileError, UntrustedFileError

PROTOCOLS = range(0, pickle.HIGHEST_PROTOCOL + 1)


@pytest.fixture
def fake_rllib(monkeypatch):
    """Classes at RLlib's module paths, importable only while pickling (the reader never imports them)."""
    module = types.ModuleType("ray.rllib.utils.filter")

    class RunningStat:
        def __init__(self, shape):
            self._n, self._M, self._S = 3, np.arange(shape, dtype=np.float64), np.ones(shape)

    class MeanStdFilter:
        def __init__(self, shape):
            self.shape, self.demean, self.destd, self.clip = (shape,), True, True, 10.0
            self.rs = RunningStat(shape)

    for cls in (RunningStat, MeanStdFilter):
        cls.__module__ = module.__name__
        cls.__qualname__ = cls.__name__
        setattr(module, cls.__name__, cls)
    for name in ("ray", "ray.rllib", "ray.rllib.utils", "ray.rllib.utils.filter"):
        monkeypatch.setitem(sys.modules, name, module if name.endswith("filter") else types.ModuleType(name))
    return module


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_arrays_and_containers_come_back_exactly(protocol):
    value = {
        "f32": np.arange(12, dtype=np.float32).reshape(3, 4),
        "fortran": np.asfortranarray(np.arange(6, dtype=np.float64).reshape(2, 3)),
        "i64": np.array([-1, 2**40], dtype=np.int64),
        "scalar": np.float32(1.5),
        "dtype": np.dtype(">f8"),
        "ordered": collections.OrderedDict([("b", 1), ("a", (2, 3.5))]),
        "default": collections.defaultdict(list, {"k": [1]}),
        "set": {1, 2},
        "frozen": frozenset({"x"}),
        "bytes": b"\x00\xffraw",
        "complex": 1 + 2j,
        "none": None,
    }
    got = load(pickle.dumps(value, protocol=protocol))
    assert list(got) == list(value)
    for key in ("f32", "fortran", "i64"):
        assert got[key].dtype == value[key].dtype and got[key].shape == value[key].shape
        assert got[key].tobytes() == value[key].tobytes()
    assert got["fortran"].flags.f_contiguous
    assert type(got["scalar"]) is np.float32 and got["scalar"] == np.float32(1.5)
    assert got["dtype"] == np.dtype(">f8")
    assert type(got["ordered"]) is collections.OrderedDict and list(got["ordered"].items()) == [("b", 1), ("a", (2, 3.5))]
    assert got["default"]["k"] == [1] and got["default"]["new"] == []
    for key in ("set", "frozen", "bytes", "complex", "none"):
        assert got[key] == value[key] and type(got[key]) is type(value[key])


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_framework_classes_become_inert_records(fake_rllib, protocol):
    data = pickle.dumps({"filters": {"default_policy": fake_rllib.MeanStdFilter(4)}}, protocol=protocol)
    for name in ("ray", "ray.rllib", "ray.rllib.utils", "ray.rllib.utils.filter"):
        del sys.modules[name]  # the reader must not need (or import) the framework
    got = load(data)
    f = got["filters"]["default_policy"]
    assert isinstance(f, Record) and f.global_name == "ray.rllib.utils.filter.MeanStdFilter"
    assert f.shape == (4,) and f.demean is True and f.clip == 10.0
    assert f.rs.global_name == "ray.rllib.utils.filter.RunningStat" and f.rs._n == 3
    np.testing.assert_array_equal(f.rs._M, np.arange(4, dtype=np.float64))
    assert "ray" not in sys.modules
    assert plain(f)["rs"]["__class__"] == "ray.rllib.utils.filter.RunningStat"


class _RunsACommand:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


class _Evaluates:
    def __reduce__(self):
        return (eval, ("__import__('os').getpid()",))


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_pickle_that_would_run_a_command_is_refused_and_nothing_runs(tmp_path, protocol):
    marker = tmp_path / "pwned"
    data = pickle.dumps({"weights": np.zeros(3), "x": _RunsACommand(marker)}, protocol=protocol)
    with pytest.raises(UntrustedFileError, match=r"(posix|os)\.system.*--trust"):
        load(data, what="checkpoint-1")
    assert not marker.exists()
    with pytest.raises(UntrustedFileError, match=r"builtins\.eval"):
        load(pickle.dumps(_Evaluates(), protocol=protocol))


def test_trust_runs_the_plain_unpickler(tmp_path):
    marker = tmp_path / "ran"
    load(pickle.dumps(_RunsACommand(marker)), trust=True)
    assert marker.exists()


def test_dangerous_modules_are_refused_even_for_class_names():
    for protocol in PROTOCOLS:  # a reference to the class, not even a call
        with pytest.raises(UntrustedFileError, match=r"subprocess\.Popen"):
            load(pickle.dumps({"p": __import__("subprocess").Popen}, protocol=protocol))


def test_numpy_random_state_is_recorded_never_built():
    got = load(pickle.dumps({"rng": np.random.RandomState(0), "mean": np.ones(2)}))
    assert isinstance(got["rng"], Record) and "randomstate" in got["rng"].global_name.lower()
    np.testing.assert_array_equal(got["mean"], np.ones(2))


@pytest.mark.parametrize("data", [b"", b"not a pickle", pickle.dumps([1, 2])[:-3]])
def test_a_broken_pickle_is_unreadable(data):
    with pytest.raises(UnreadableFileError, match="not a readable pickle"):
        load(data)


def test_a_missing_file_is_unreadable(tmp_path):
    with pytest.raises(UnreadableFileError, match="cannot read"):
        load(tmp_path / "nope.pkl")


@pytest.fixture
def fake_spaces(monkeypatch):
    """A dict subclass, a list subclass and a plain class at a framework's module path."""
    module = types.ModuleType("gymnasium.spaces.fake")

    class Table(dict):
        pass

    class Queue(list):
        pass

    class Plain:
        pass

    for cls in (Table, Queue, Plain):
        cls.__module__ = module.__name__
        cls.__qualname__ = cls.__name__
        setattr(module, cls.__name__, cls)
    for name in ("gymnasium", "gymnasium.spaces", "gymnasium.spaces.fake"):
        monkeypatch.setitem(sys.modules, name, module if name.endswith("fake") else types.ModuleType(name))
    return module


@pytest.mark.parametrize("protocol", range(2, pickle.HIGHEST_PROTOCOL + 1))
def test_dict_and_list_subclasses_keep_their_items_and_state(fake_spaces, protocol):
    table = fake_spaces.Table(a=1, b=[2])
    table.note = "t"
    many = fake_spaces.Queue([1, 2, 3])
    many.cap = 3
    got = load(pickle.dumps({"table": table, "one": fake_spaces.Queue([5]), "many": many}, protocol=protocol))
    t, one, m = got["table"], got["one"], got["many"]
    assert [r.global_name for r in (t, one, m)] == ["gymnasium.spaces.fake.Table", "gymnasium.spaces.fake.Queue",
                                                    "gymnasium.spaces.fake.Queue"]
    assert (t.items, t.state, t.list_items) == ({"a": 1, "b": [2]}, {"note": "t"}, [])
    assert (one.list_items, one.state, one.items) == ([5], None, {})
    assert (m.list_items, m.state) == ([1, 2, 3], {"cap": 3})
    assert repr(t) == "<Record gymnasium.spaces.fake.Table state=['note']>"
    assert repr(one) == "<Record gymnasium.spaces.fake.Queue state=NoneType>"
    assert plain(t) == {"__class__": "gymnasium.spaces.fake.Table", "note": "t", "__items__": {"a": 1, "b": [2]}}


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_plain_object_of_a_framework_class_keeps_its_state(fake_spaces, protocol):
    obj = fake_spaces.Plain()
    obj.low, obj.high = np.zeros(2, np.float32), [1.0, 2.0]
    got = load(pickle.dumps([obj], protocol=protocol))[0]
    assert isinstance(got, Record) and got.global_name == "gymnasium.spaces.fake.Plain"
    assert got.args == () and sorted(got.state) == ["high", "low"] and got.high == [1.0, 2.0]
    assert got.low.dtype == np.float32 and got.low.tolist() == [0.0, 0.0]
    assert repr(got) == "<Record gymnasium.spaces.fake.Plain state=['high', 'low']>"


def test_plain_spells_out_arguments_and_a_state_that_is_no_dict():
    record = Record(1, np.float64(2.5))
    record.__setstate__([3, Record()])
    assert plain({"r": record, "t": (record,)}) == {
        "r": {"__class__": "?", "__state__": [3, {"__class__": "?"}], "__args__": [1, 2.5]},
        "t": ({"__class__": "?", "__state__": [3, {"__class__": "?"}], "__args__": [1, 2.5]},)}
    assert plain([Record()]) == [{"__class__": "?"}]


class _Encode:
    """Pickles as a call of ``_codecs.encode(text, encoding)``, as protocol 2 stores bytes."""

    def __init__(self, text, encoding):
        self.args = (text, encoding)

    def __reduce__(self):
        import codecs

        return codecs.encode, self.args


def test_only_latin1_text_is_encoded_to_bytes():
    assert load(pickle.dumps([_Encode("\xe9a", "latin1"), _Encode("\xff", "latin-1")], protocol=2)) == [b"\xe9a", b"\xff"]
    for text, encoding in (("\xe9", "utf-8"), (b"\xe9", "latin1")):
        with pytest.raises(UntrustedFileError, match=rf"^the pickle asks for _codecs.encode\(\.\.\., {encoding!r}\); "
                                                     r"only latin1 bytes are rebuilt$"):
            load(pickle.dumps(_Encode(text, encoding), protocol=2))


def test_a_records_repr_names_the_type_of_a_state_that_is_no_dict():
    record = Record()
    assert repr(record) == "<Record ? state=NoneType>"
    record.__setstate__([1, 2])
    assert repr(record) == "<Record ? state=list>"
    record.__setstate__({"b": 1, "a": 2})
    assert repr(record) == "<Record ? state=['a', 'b']>"
