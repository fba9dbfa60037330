"""The restricted unpickler: arrays and containers come back exactly, framework classes come back as
inert records, and a pickle that would run code is refused before anything runs."""

from __future__ import annotations

import collections
import copyreg
import functools
import io
import os
import pickle
import pickletools
import re
import sys
import types

import numpy as np
import pytest

from policyport.converter.readers.unpickle import Call, Record, _numpy_core, load, plain
from policyport.errors import LimitExceededError, UnreadableFileError, UntrustedFileError
from policyport.io.limits import using_limits

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


@pytest.mark.parametrize("protocol", PROTOCOLS)  # 0-1 pass the items to copyreg._reconstructor, 2+ set them
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


class _Reduces:
    """Pickles as ``callable(*args)`` (and a ``state`` for ``__setstate__``), the way a class's own
    ``__reduce__`` may name a reconstructor at any protocol."""

    def __init__(self, callable_, args, state=None):
        self.reduced = (callable_, args) if state is None else (callable_, args, state)

    def __reduce__(self):
        return self.reduced


#: values pickled through the reconstructors the reader allows; copyreg.__newobj__ is a global of
#: protocols 0 and 1 only (2+ write the NEWOBJ opcode, and refuse to pickle these odd arguments)
RECONSTRUCTED = {
    "newobj-dict": (_Reduces(copyreg.__newobj__, (dict, {"a": 1})), (0, 1)),  # __new__ alone: an empty dict
    "newobj-int": (_Reduces(copyreg.__newobj__, (int, 5)), (0, 1)),
    "newobj-state": (_Reduces(copyreg.__newobj__, (collections.OrderedDict,), {"x": 1}), (0, 1)),
    "reconstructor-dict": (_Reduces(copyreg._reconstructor, (collections.OrderedDict, dict, {"b": 2})), PROTOCOLS),
    "reconstructor-int": (_Reduces(copyreg._reconstructor, (int, int, 7)), PROTOCOLS),
    "reconstructor-object": (_Reduces(copyreg._reconstructor, (object, object, None)), PROTOCOLS),
    "defaultdict-items": (_Reduces(collections.defaultdict, (list, {"k": [1]})), PROTOCOLS),
    "xrange": (range(2, 9, 3), PROTOCOLS),  # protocols 0-2 write Python 2's __builtin__.xrange
    "numpy-types": ([np.bool_, np.float16, np.float32, np.float64, np.int8, np.int16, np.int32, np.int64, np.uint8,
                     np.uint16, np.uint32, np.uint64, np.ndarray, np.dtype], PROTOCOLS),
}


@pytest.mark.parametrize("value, protocol", [pytest.param(value, protocol, id=f"{name}-{protocol}")
                                             for name, (value, protocols) in RECONSTRUCTED.items()
                                             for protocol in protocols])
def test_the_reconstructors_it_allows_build_what_pickle_builds(value, protocol):
    data = pickle.dumps(value, protocol=protocol)
    got, want = load(data), pickle.loads(data)
    assert type(got) is type(want)
    if type(want) is object:
        return
    assert got == want
    if isinstance(want, collections.OrderedDict):
        assert got.__dict__ == want.__dict__
    if isinstance(want, collections.defaultdict):
        assert got.default_factory is list


@pytest.mark.parametrize("prefix", [b"numpy.core", b"numpy._core"])
def test_arrays_and_scalars_pickled_by_numpy_1_or_2_both_come_back(prefix):
    value = [np.arange(6, dtype=np.int16).reshape(2, 3), np.float32(2.5), np.bool_(True)]
    data = pickle.dumps(value, protocol=2).replace(b"numpy._core.multiarray\n", prefix + b".multiarray\n")
    assert data.count(prefix + b".multiarray\n") == 2  # _reconstruct and scalar, as a GLOBAL each
    got = load(data)
    assert got[0].dtype == np.int16 and got[0].tolist() == [[0, 1, 2], [3, 4, 5]]
    assert type(got[1]) is np.float32 and got[1] == 2.5 and type(got[2]) is np.bool_ and got[2]


@pytest.fixture
def fake_framework(monkeypatch):
    """A framework module holding a reconstructor, an int subclass, a nested class and a slotted class."""
    module = types.ModuleType("fakefw.util")

    def make_thing(n):
        return n

    class Count(int):
        pass

    class Outer:
        class Inner:
            class Deepest:
                pass

        @staticmethod
        def make():
            return None

    class Slotted:
        __slots__ = ("a",)

    for obj in (make_thing, Count, Outer, Slotted):
        obj.__module__ = module.__name__
        setattr(module, obj.__name__, obj)
    for obj, qualname in ((make_thing, "make_thing"), (Count, "Count"), (Outer, "Outer"), (Outer.Inner, "Outer.Inner"),
                          (Outer.Inner.Deepest, "Outer.Inner.Deepest"), (Slotted, "Slotted")):
        obj.__qualname__ = qualname
    Outer.Inner.__module__ = Outer.Inner.Deepest.__module__ = Outer.make.__module__ = module.__name__
    Outer.make.__qualname__ = "Outer.make"
    monkeypatch.setitem(sys.modules, "fakefw", types.ModuleType("fakefw"))
    monkeypatch.setitem(sys.modules, "fakefw.util", module)
    return module


REFUSED = ("{what} asks to call {name} while unpickling, which could run arbitrary code; policyport rebuilds only "
           "numpy arrays and plain containers from a pickle and refused it (nothing from the file ran). If you trust "
           "this file, pass --trust (trust=True)")


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_function_of_a_framework_is_refused_unless_its_module_is_inert(fake_framework, protocol):
    data = pickle.dumps([_Reduces(fake_framework.make_thing, (3,))], protocol=protocol)
    with pytest.raises(UntrustedFileError) as refused:
        load(data, what="ckpt.pkl")
    assert str(refused.value) == REFUSED.format(what="ckpt.pkl", name="fakefw.util.make_thing")
    for inert in (("fakefw",), ("fakefw.util",), ("other", "fakefw")):
        record = load(data, inert_modules=inert)[0]
        assert isinstance(record, Record) and record.global_name == "fakefw.util.make_thing" and record.args == (3,)
    for not_inert in (("fakef",), ("fakefw.util.make",), ("fakefw.utility",)):
        with pytest.raises(UntrustedFileError, match=r"asks to call fakefw\.util\.make_thing while"):
            load(data, inert_modules=not_inert)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_partial_of_a_class_that_the_pickle_calls_is_recorded_with_every_argument(fake_framework, protocol):
    # tf_keras pickles a TensorFlow variable as (functools.partial(ResourceVariable, **kwargs), ())
    variable = _Reduces(functools.partial(fake_framework.Outer, 5, name="Adam/m/fc_1/kernel",
                                          initial_value=np.arange(6.0).reshape(2, 3)), (7,))
    got = load(pickle.dumps({"weights": [np.ones(2)], "optimizer": [variable]}, protocol=protocol))
    record = got["optimizer"][0]
    assert type(record).__mro__[1] is Record and record.global_name == "fakefw.util.Outer"
    assert record.args == (5, 7) and sorted(record.kwargs) == ["initial_value", "name"]
    assert record.kwargs["name"] == "Adam/m/fc_1/kernel"
    np.testing.assert_array_equal(record.kwargs["initial_value"], np.arange(6.0).reshape(2, 3))
    np.testing.assert_array_equal(got["weights"][0], np.ones(2))


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_partial_of_a_function_is_refused_as_the_function_is_and_nothing_runs(tmp_path, fake_framework, protocol):
    marker = tmp_path / "ran"
    data = pickle.dumps(_Reduces(functools.partial(os.system, f"touch {marker}"), ()), protocol=protocol)
    with pytest.raises(UntrustedFileError) as refused:
        load(data, what="policy_state.pkl")
    assert str(refused.value) == REFUSED.format(what="policy_state.pkl", name=f"{os.system.__module__}.system")
    assert not marker.exists()
    data = pickle.dumps(_Reduces(functools.partial(fake_framework.make_thing, 3), ()), protocol=protocol)
    with pytest.raises(UntrustedFileError) as refused:
        load(data, what="policy_state.pkl")
    assert str(refused.value) == REFUSED.format(what="policy_state.pkl", name="fakefw.util.make_thing")
    record = load(data, inert_modules=("fakefw",))  # a framework helper of an inert module: recorded, not called
    assert record.global_name == "fakefw.util.make_thing" and record.args == (3,)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_record_the_pickle_calls_gives_a_call_record_naming_it(fake_framework, monkeypatch, protocol):
    monkeypatch.setattr(fake_framework.Outer, "__call__", lambda self, *args: args, raising=False)  # for pickle.dumps
    got = load(pickle.dumps(_Reduces(fake_framework.Outer(), (1, "a")), protocol=protocol))
    assert isinstance(got, Call) and got.global_name == "fakefw.util.Outer(...)" and got.args == (1, "a")
    assert got.state["callee"].global_name == "fakefw.util.Outer" and not isinstance(got.state["callee"], Call)


@pytest.mark.parametrize("protocol", range(4, pickle.HIGHEST_PROTOCOL + 1))
def test_a_nested_class_is_a_class_and_its_stand_in_is_named_after_it(fake_framework, protocol):
    data = pickle.dumps([fake_framework.Outer.Inner(), fake_framework.Outer.Inner()], protocol=protocol)
    first, second = load(data)
    assert type(first) is type(second) and type(first).__name__ == "Inner"  # one stand-in per global
    assert first.global_name == "fakefw.util.Outer.Inner" and type(first).__module__ == "policyport.inert"
    deepest = load(pickle.dumps(fake_framework.Outer.Inner.Deepest(), protocol=protocol))
    assert type(deepest).__name__ == "Deepest" and deepest.global_name == "fakefw.util.Outer.Inner.Deepest"
    with pytest.raises(UntrustedFileError, match=r"^the pickle asks to call fakefw\.util\.Outer\.make while"):
        load(pickle.dumps(fake_framework.Outer.make, protocol=protocol))  # a function, by its qualified name


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_subclass_of_a_builtin_keeps_the_builtins_value_at_every_protocol(fake_framework, protocol):
    got = load(pickle.dumps(fake_framework.Count(7), protocol=protocol))
    assert isinstance(got, Record) and got.global_name == "fakefw.util.Count"
    assert got.args == (7,) and got.items == {} and got.list_items == []


@pytest.mark.parametrize("protocol", range(2, pickle.HIGHEST_PROTOCOL + 1))
def test_slot_values_are_merged_into_the_state(fake_framework, protocol):
    obj = fake_framework.Slotted()
    obj.a = np.int8(4)
    got = load(pickle.dumps(obj, protocol=protocol))
    assert got.state == {"a": 4} and type(got.a) is np.int8


@pytest.mark.parametrize("state, merged", [
    ((None, {"a": 1}), {"a": 1}),
    (({"a": 1, "b": 2}, {"b": 3}), {"a": 1, "b": 3}),  # the slots win, as object.__setstate__ sets them last
    (({}, {}), {}),
    (({"a": 1}, None), ({"a": 1}, None)),  # not (dict, slots): kept as it came
    (({"a": 1}, {"b": 2}, {}), ({"a": 1}, {"b": 2}, {})),
    (([1], {"b": 2}), ([1], {"b": 2})),
    ((None, None), (None, None)),
    ([{"a": 1}, {"b": 2}], [{"a": 1}, {"b": 2}]),
])
def test_setstate_merges_a_dict_and_slots_pair_and_keeps_anything_else(state, merged):
    record = Record()
    record.__setstate__(state)
    assert record.state == merged and type(record.state) is type(merged)


def test_get_append_and_attributes_read_the_records_own_parts():
    record = Record()
    assert record.get("a") is None and record.get("a", 5) == 5
    with pytest.raises(AttributeError, match=r"^\? record has no attribute 'a'$"):
        record.a  # noqa: B018
    record.__setstate__({"a": 0, "b": None})
    assert record.get("a", 5) == 0 and record.get("b", 5) is None and record.get("c", 5) == 5 and record.get("c") is None
    assert record.a == 0 and record.b is None
    record.__setstate__([("a", 1)])  # a state that is no dict has no attributes
    assert record.get("a", 5) == 5
    with pytest.raises(AttributeError, match=r"^\? record has no attribute 'a'$"):
        record.a  # noqa: B018
    record.append(np.float32(1))  # pure-Python unpicklers append one by one; the C one extends
    record.append([2])
    record.extend([3])
    assert record.list_items == [1, [2], 3] and type(record.list_items[0]) is np.float32


def test_a_persistent_id_is_refused_without_a_resolver():
    class WithIds(pickle.Pickler):
        def persistent_id(self, obj):
            return ("storage", 3) if isinstance(obj, bytes) else None

    buffer = io.BytesIO()
    WithIds(buffer).dump({"w": b"raw"})
    with pytest.raises(UntrustedFileError, match=r"^model\.pt uses persistent ids \(tuple\), which this reader does "
                                                 r"not rebuild$"):
        load(buffer.getvalue(), what="model.pt")
    assert load(buffer.getvalue(), persistent_load=lambda pid: f"resolved {pid}") == {"w": "resolved ('storage', 3)"}


def test_messages_name_the_file_by_its_path_or_as_the_pickle(tmp_path):
    path = tmp_path / "bad.pkl"
    path.write_bytes(pickle.dumps(os.getcwd))
    name = f"{os.getcwd.__module__}.getcwd"
    for source, what, named in ((path, None, str(path)), (str(path), None, str(path)), (path, "x.pkl", "x.pkl"),
                                (path.read_bytes(), None, "the pickle"), (path.read_bytes(), "y", "y")):
        with pytest.raises(UntrustedFileError) as refused:
            load(source, what=what)
        assert str(refused.value) == REFUSED.format(what=named, name=name)
    path.write_bytes(b"")
    with pytest.raises(UnreadableFileError, match=rf"^{re.escape(str(path))} is not a readable pickle: EOFError: "):
        load(path)
    with pytest.raises(UnreadableFileError, match=r"^the pickle is not a readable pickle: UnpicklingError: "):
        load(b"\x80\x02K")


@pytest.mark.parametrize("module, name, refused", [
    ("multiprocessing.pool", "ThreadPool", True),  # a class, but of a submodule of a dangerous module
    ("os.path", "Thing", True),
    ("numpy.lib.format", "Header", True),
    ("ossify.models", "Model", False),  # a module whose name merely starts like a dangerous one
    ("subprocessing", "Runner", False),
])
def test_every_submodule_of_a_dangerous_module_is_refused_and_only_those(module, name, refused):
    data = f"c{module}\n{name}\n.".encode()  # a protocol-0 reference to the global, nothing called
    if refused:
        with pytest.raises(UntrustedFileError) as caught:
            load(data)
        assert str(caught.value) == REFUSED.format(what="the pickle", name=f"{module}.{name}")
    else:
        stand_in = load(data)
        assert issubclass(stand_in, Record) and stand_in.global_name == f"{module}.{name}"


def test_the_numpy_core_modules_are_found_under_numpy_2_and_numpy_1_names(monkeypatch):
    import importlib

    from policyport.converter.readers.unpickle import _numpy_core

    real = importlib.import_module
    assert _numpy_core("multiarray") is real("numpy._core.multiarray" if int(np.__version__.split(".")[0]) >= 2
                                                     else "numpy.core.multiarray")
    tried = []

    def numpy_1(name):
        tried.append(name)
        if name.startswith("numpy._core."):
            raise ImportError(name)
        return f"module {name}"

    monkeypatch.setattr(importlib, "import_module", numpy_1)
    assert _numpy_core("numeric") == "module numpy.core.numeric" and tried == ["numpy._core.numeric", "numpy.core.numeric"]

    def neither(name):
        raise ImportError(name)

    monkeypatch.setattr(importlib, "import_module", neither)
    with pytest.raises(UnreadableFileError, match=r"^numpy has no module core\.numeric$"):
        _numpy_core("numeric")


@pytest.mark.parametrize("name, numpy_type", [("bool_", np.bool_), ("bool", np.bool_), ("float32", np.float32),
                                              ("uint64", np.uint64), ("ndarray", np.ndarray), ("dtype", np.dtype)])
def test_numpy_types_are_rebuilt_by_the_names_numpy_1_and_2_pickle_them_under(name, numpy_type):
    assert load(f"cnumpy\n{name}\n.".encode()) is numpy_type  # numpy 1 pickles its bool type as bool_, numpy 2 as bool


# ------------------------------------------------------------------- sizes the pickle's calls declare


class _Asks:
    """Pickles as ``func(*args)``: what a hostile pickle can ask any allowed callable for."""

    def __init__(self, func, *args):
        self.func, self.args = func, args

    def __reduce__(self):
        return self.func, self.args


@pytest.mark.parametrize("value, protocol, call", [
    (_Asks(bytearray, 2000), 2, "builtins.bytearray(2000)"),
    (_Asks(bytes, 2000), 2, "builtins.bytes(2000)"),
    (_Asks(list, range(300)), 2, "builtins.list(range(0, 300))"),  # 300 items of 8 bytes at least
    (_Asks(frozenset, range(300)), 4, "builtins.frozenset(range(0, 300))"),
    (_Asks(copyreg.__newobj__, tuple, range(300)), 1, "copyreg.__newobj__(builtins.tuple, range(0, 300))"),
    (_Asks(copyreg.__newobj__, bytes, 2000), 1, "copyreg.__newobj__(builtins.bytes, 2000)"),
    (_Asks(copyreg._reconstructor, bytearray, bytearray, 2000), 2,
     "copyreg._reconstructor(builtins.bytearray, builtins.bytearray, 2000)"),
    (_Asks(np.ndarray, (50, 10)), 2, "numpy.ndarray((50, 10))"),  # float64: 4,000 bytes
    (_Asks(_numpy_core("multiarray")._reconstruct, np.ndarray, (600,), b"f"), 2,
     "_reconstruct(numpy.ndarray, (600,), bytes)"),  # float32: 2,400 bytes
    (_Asks(copyreg.__newobj__, np.ndarray, (1000,), np.float32, b"\0" * 4, 0, (0,)), 1,
     "copyreg.__newobj__(numpy.ndarray, (1000,), numpy.float32, bytes, ...)"),  # stride 0 over 4 bytes
])
def test_a_call_is_refused_by_the_sizes_its_arguments_declare_before_it_is_made(value, protocol, call):
    data = pickle.dumps(value, protocol=protocol)
    with using_limits(array_bytes=1000), pytest.raises(LimitExceededError) as refused:
        load(data, what="x.pkl")
    message = str(refused.value)
    assert message.startswith("x.pkl asks for ") and call in message, message
    assert "above the limit of 1000 B for data read from a file" in message


def test_what_the_calls_of_one_pickle_declare_adds_up():
    data = pickle.dumps([_Asks(bytearray, 600), _Asks(bytearray, 600)], protocol=2)
    with using_limits(array_bytes=1000), pytest.raises(LimitExceededError, match=(
            r"^the pickle asks for builtins\.bytearray\(600\), which with what it asked for before would take 1\.17 KiB "
            r"\(1,200 bytes\), above the limit of 1000 B")):
        load(data)
    with using_limits(array_bytes=1200):
        assert load(data) == [bytearray(600), bytearray(600)]


def test_a_newobj_opcode_is_sized_as_the_call_it_makes():
    """Protocol 2's NEWOBJ calls cls.__new__ itself: ndarray.__new__(ndarray, shape) allocates the shape."""
    data = b"\x80\x02cnumpy\nndarray\nq\x00M\xe8\x03\x85q\x01\x81q\x02."  # ndarray.__new__(ndarray, 1000)
    with using_limits(array_bytes=1000), pytest.raises(LimitExceededError, match=r"asks for numpy\.ndarray\(1000\), "
                                                                                 r"which would take 7\.81 KiB"):
        load(data)
    with using_limits(array_bytes=8000):
        assert load(data).shape == (1000,)


def test_the_values_of_allowed_classes_stay_what_they_are():
    value = [np.ndarray, bytes, bytearray, range, np.float32, range(3), bytearray(b"ab"), np.zeros((2, 3), np.int8)]
    got = load(pickle.dumps(value, protocol=2))
    assert got[:5] == [np.ndarray, bytes, bytearray, range, np.float32]
    assert got[5] == range(3) and got[6] == bytearray(b"ab") and got[7].shape == (2, 3)


def _dag(depth: int) -> list:
    value: list = [0]
    for _ in range(depth):
        value = [value, value]
    return value


def test_a_dag_is_counted_as_it_is_written_out_and_refused_above_the_limit():
    from policyport.converter.readers.unpickle import written_items

    assert written_items(_dag(0)) == 2 and written_items(_dag(3)) == 3 * 2**3 - 1
    assert written_items(_dag(60)) == 3 * 2**60 - 1  # counted in 60 steps
    cyclic: list = [1]
    cyclic.append(cyclic)
    assert written_items(cyclic) == 3  # the list, 1, and itself once
    data = pickle.dumps({"a": _dag(40)}, protocol=4)
    assert len(data) < 1000
    with pytest.raises(LimitExceededError, match=r"^x\.pkl holds objects that, written out with every object its pickle "
                                                 r"shares repeated where it appears, are 3,298,534,883,329 objects, which "
                                                 r"would take 24 TiB \(26,388,279,066,632 bytes\), above the limit of 1 GiB"):
        load(data, what="x.pkl")


def test_plain_keeps_what_the_pickle_shares_shared(monkeypatch):
    dag = load(pickle.dumps(_dag(24), protocol=4))  # as a tree: 50 million objects, under the limit
    out = plain(dag)
    assert out[0] is out[1] and out[0][0] is out[0][1]
    depth, node = 0, out
    while node != [0]:
        node, depth = node[0], depth + 1
    assert depth == 24
    module = types.ModuleType("fakefw.models")

    class Thing:
        pass

    Thing.__module__, Thing.__qualname__ = module.__name__, "Thing"
    module.Thing = Thing
    monkeypatch.setitem(sys.modules, "fakefw", types.ModuleType("fakefw"))
    monkeypatch.setitem(sys.modules, "fakefw.models", module)
    inner, outer = Thing(), Thing()
    inner.x = 1
    outer.a = outer.b = inner
    flat = plain(load(pickle.dumps(outer, protocol=4)))
    assert flat["a"] is flat["b"] and flat["a"] == {"__class__": "fakefw.models.Thing", "x": 1}


def test_a_truncated_pickle_is_told_as_the_c_unpickler_tells_it():
    data = pickle.dumps({"a": np.zeros(3)}, protocol=2)
    for cut in (3, len(data) // 2, len(data) - 1):
        with pytest.raises(UnreadableFileError, match=r"^the pickle is not a readable pickle: "
                                                      r"(UnpicklingError: pickle data was truncated|EOFError)"):
            load(data[:cut])


def _tuple_dag(depth: int) -> tuple:
    value: tuple = (0,)
    for _ in range(depth):
        value = (value, value)
    return value


def _pushing_tuple_dag(depth: int) -> bytes:
    """Opcodes pushing ``_tuple_dag(depth)`` built through the memo (indices 0 to depth), which
    Python could not pickle from a dict or set holding it without hashing it first."""
    ops = b"K\x00\x85\x94"  # BININT1 0, TUPLE1, MEMOIZE
    for i in range(depth):
        ops += b"0h" + bytes([i]) + b"h" + bytes([i]) + b"\x86\x94"  # POP, BINGET i twice, TUPLE2, MEMOIZE
    return ops


#: PROTO 4 ... STOP around opcodes that hash a tuple nested 40 deep through the memo
_T40 = _pushing_tuple_dag(40)
HASHING = {
    "SETITEM": b"}" + _T40 + b"K\x01s",  # EMPTY_DICT, key, BININT1 1, SETITEM
    "SETITEMS": b"}(K\x01K\x02" + _T40 + b"K\x01u",  # EMPTY_DICT, MARK, 1: 2, key: 1, SETITEMS
    "DICT": b"(" + _T40 + b"K\x01d",  # MARK, key: 1, DICT
    "ADDITEMS": b"\x8f(" + _T40 + b"\x90",  # EMPTY_SET, MARK, item, ADDITEMS
    "FROZENSET": b"(" + _T40 + b"\x91",  # MARK, item, FROZENSET
    "frozenset([t])": b"\x8c\x08builtins\x8c\tfrozenset\x93]" + _T40 + b"a\x85R",  # frozenset([t]): REDUCE
}


@pytest.mark.parametrize("body, how", [
    *[pytest.param(body, "a key it hashes holds" if name != "frozenset([t])" else "builtins.frozenset(list) walks",
                   id=name) for name, body in HASHING.items()],
    pytest.param(pickle.dumps(_Asks(np.float32, _dag(40)), protocol=4)[2:-1], "numpy.float32(list) walks", id="float32"),
    pytest.param(pickle.dumps(_Asks(str, _dag(40)), protocol=4)[2:-1], "builtins.str(list) walks", id="str"),
])
def test_what_loading_would_walk_whole_is_checked_by_its_written_size_first(body, how):
    data = b"\x80\x04" + body + b"."
    assert len(data) < 2000
    assert pickletools.dis(data, io.StringIO()) is None  # a well-formed pickle
    with pytest.raises(LimitExceededError, match=rf"^x\.pkl: {re.escape(how)} objects that, written out with every "
                                                 r"object its pickle shares repeated where it appears, are [\d,]+ "
                                                 r"objects, which would take \d+ TiB"):
        load(data, what="x.pkl")


def test_small_tuples_as_keys_and_numpy_scalars_still_load():
    value = {_tuple_dag(3): 1, "s": frozenset({(1, 2)}), "f": np.float32(2.5), "o": collections.OrderedDict(a=(1,))}
    assert load(pickle.dumps(value, protocol=4)) == value
    assert load(pickle.dumps(_Asks(frozenset, [(1, 2), (1, 2)]), protocol=2)) == frozenset({(1, 2)})


def test_a_numpy_dtype_given_a_state_it_cannot_take_is_an_unreadable_pickle():
    """numpy's C ``dtype.__setstate__`` reports a state that is not a tuple as a SystemError."""
    dtype_built_from_none = b"\x80\x02cnumpy\ndtype\nX\x02\x00\x00\x00f4\x89\x88\x87RNb."
    with pytest.raises(UnreadableFileError) as caught:
        load(dtype_built_from_none, what="state.pkl")
    assert str(caught.value).startswith("state.pkl is not a readable pickle: SystemError: ")
