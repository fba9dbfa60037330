"""A small, strict validator of JSON documents against declarative schemas (standard library only).

The documents of a packed folder (``policy.json``, ``graph.json``) are read on machines that have
numpy and nothing else, so their schemas are declared with the few combinators below instead of a
third-party library. A schema is a tree of :class:`Schema` objects; :meth:`Schema.validate` walks
the document with it and raises :class:`SchemaError` at the first value that does not fit, naming
the document, the place (``nodes[3].attrs``) and what was expected and found::

    VALUE_INFO = Obj({"name": Str(), "dtype": OneOf("float32", "float64"), "shape": Null | ListOf(Int(0))})
    VALUE_INFO.validate(json.loads(text), "policy.json")

Every object is closed (a key the schema does not name is refused) unless declared with ``MapOf``
or :class:`Anything`; JSON booleans are not integers; every list and map has a maximum length.
Nesting depth is bounded by :func:`check_depth`, which runs without recursion, so no document can
exhaust the interpreter's stack.
"""

from __future__ import annotations

import json
import math
import re
import sys
from typing import Any, Callable

from ..errors import BadModelError, PolicyportError


class SchemaError(BadModelError):
    """A JSON document that does not fit its schema (exit 3)."""


def kind(value: Any) -> str:
    """The JSON name of a parsed value's type: object, array, string, integer, number, boolean, null."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    return {str: "string", list: "array", dict: "object"}.get(type(value), type(value).__name__)


def load_json(text: str | bytes | bytearray, what: str, *, error: type[PolicyportError] = BadModelError,
              depth: int | None = None) -> Any:
    """The JSON document ``text`` holds, whatever the text: every way it can fail to be one is ``error``.

    Python's parser recurses once per nested array or object, so deeply nested text (``[[[[...``)
    raises ``RecursionError`` rather than ``ValueError``; this is the one place JSON from outside
    policyport (a file, a member of an archive, a model's metadata) is parsed, and it turns both
    into ``error`` naming ``what``.

    Args:
        text: the JSON text, or its UTF-8 bytes (RFC 8259 JSON is UTF-8).
        what: how messages name the text: ``"model metadata 'policyport.parameters'"``, ``"the zip's
            data member"``, a path.
        error: the :class:`PolicyportError` subclass to raise: ``UnreadableFileError`` or
            ``BadModelError`` for a file or a model (exit 3), ``OptionError`` for an option's value
            (exit 2).
        depth: the most levels of nested arrays and objects the document may have, checked
            without recursion (:func:`check_depth`); ``None`` for as many as the parser reads.

    Returns:
        The parsed document: dict, list, str, int, float, bool or None.

    Raises:
        error: ``text`` is not UTF-8, not JSON, or nested too deeply to parse.
        SchemaError: nested deeper than ``depth``.
    """
    if isinstance(text, (bytes, bytearray)):
        try:
            text = bytes(text).decode("utf-8")
        except UnicodeDecodeError as e:
            raise error(f"{what} is not UTF-8 text: {e}") from None
    try:
        doc = json.loads(text)
    except RecursionError:
        if depth is not None:
            raise error(f"{what}: nested deeper than {depth} levels of arrays and objects") from None
        raise error(f"{what}: its arrays and objects nest deeper than Python parses (about "
                    f"{sys.getrecursionlimit():,} levels)") from None
    except ValueError as e:
        raise error(f"{what} is not valid JSON: {e}") from None
    if depth is not None:
        check_depth(doc, depth, what)
    return doc


def check_depth(value: Any, limit: int, document: str) -> None:
    """Refuse a parsed document nested deeper than ``limit`` arrays/objects (iteratively).

    Raises:
        SchemaError: naming the document and the limit.
    """
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        for child in children:
            if isinstance(child, (dict, list)):
                if depth + 1 > limit:
                    raise SchemaError(f"{document}: nested deeper than {limit} levels of arrays and objects")
                stack.append((child, depth + 1))


class Schema:
    """What a JSON value must be. Subclasses implement :meth:`check`."""

    expected = "a value"

    def check(self, value: Any, where: str) -> str | None:
        """``None`` if ``value`` fits, else the place and problem (``"nodes[2].attrs: ..."``)."""
        raise NotImplementedError

    def claims(self, value: Any) -> bool:
        """Whether ``value`` is of the JSON kind this schema describes (so its errors are the ones to show)."""
        return self.check(value, "") is None

    def validate(self, value: Any, document: str) -> Any:
        """Return ``value`` if it fits; else raise :class:`SchemaError` naming ``document``."""
        problem = self.check(value, "")
        if problem is not None:
            raise SchemaError(f"{document}: {problem}")
        return value

    def _wrong(self, value: Any, where: str) -> str:
        return f"{where or 'the document'} must be {self.expected}, found {_show(value)}"

    def __or__(self, other: Schema) -> Schema:
        return Either(self, other)


def _show(value: Any) -> str:
    if isinstance(value, (dict, list)):
        return f"an {kind(value)}" if kind(value) in ("object", "array") else kind(value)
    text = repr(value)
    return f"{kind(value)} {text[:60] + '...' if len(text) > 60 else text}"


def _at(where: str, key: Any) -> str:
    if isinstance(key, int):
        return f"{where}[{key}]"
    if isinstance(key, str) and key.isidentifier():
        return f"{where}.{key}" if where else key
    return f"{where}[{key!r}]"


class Anything(Schema):
    """Any JSON value (its depth is bounded by :func:`check_depth`)."""

    expected = "any JSON value"

    def check(self, value, where):
        return None


class _Null(Schema):
    expected = "null"

    def claims(self, value):
        return value is None

    def check(self, value, where):
        return None if value is None else self._wrong(value, where)


Null = _Null()


class Str(Schema):
    """A string of at most ``max_len`` characters, matching ``pattern`` (a full match) if given."""

    def __init__(self, max_len: int = 65536, pattern: str | None = None, what: str | None = None):
        self.max_len = max_len
        self.pattern = re.compile(pattern) if pattern else None
        self.expected = what or "a string"

    def claims(self, value):
        return isinstance(value, str)

    def check(self, value, where):
        if not isinstance(value, str):
            return self._wrong(value, where)
        if len(value) > self.max_len:
            return f"{where} is a string of {len(value)} characters; at most {self.max_len} are allowed"
        if self.pattern is not None and not self.pattern.fullmatch(value):
            return self._wrong(value, where)
        return None


class Int(Schema):
    """An integer (not a boolean) in ``[lo, hi]``."""

    def __init__(self, lo: int | None = None, hi: int | None = None):
        self.lo, self.hi = lo, hi
        bounds = [f">= {lo}" if lo is not None else "", f"<= {hi}" if hi is not None else ""]
        self.expected = "an integer" + (" " + " and ".join(b for b in bounds if b) if any(bounds) else "")

    def claims(self, value):
        return isinstance(value, int) and not isinstance(value, bool)

    def check(self, value, where):
        if not isinstance(value, int) or isinstance(value, bool):
            return self._wrong(value, where)
        if (self.lo is not None and value < self.lo) or (self.hi is not None and value > self.hi):
            return self._wrong(value, where)
        return None


class Num(Schema):
    """A number (integer or float, NaN and infinities included; not a boolean)."""

    expected = "a number"

    def claims(self, value):
        return isinstance(value, (int, float)) and not isinstance(value, bool)

    def check(self, value, where):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return self._wrong(value, where)
        return None


class Finite(Num):
    """A finite number."""

    expected = "a finite number"

    def check(self, value, where):
        return super().check(value, where) or (None if math.isfinite(value) else self._wrong(value, where))


class OneOf(Schema):
    """One of the given JSON scalars (compared by type and value); ``what`` describes them in errors."""

    def __init__(self, *values: Any, what: str | None = None):
        self.values = values
        self.expected = what or "one of " + ", ".join(repr(v) for v in values)

    def claims(self, value):
        return any(type(value) is type(v) for v in self.values)

    def check(self, value, where):
        if any(type(value) is type(v) and value == v for v in self.values):
            return None
        return self._wrong(value, where)


def Const(value: Any) -> OneOf:  # noqa: N802 - reads as a schema constructor
    """Exactly ``value``."""
    return OneOf(value)


class ListOf(Schema):
    """An array of at most ``max_items`` items, each fitting ``item``."""

    def __init__(self, item: Schema, max_items: int = 1_000_000):
        self.item, self.max_items = item, max_items
        self.expected = "an array"

    def claims(self, value):
        return isinstance(value, list)

    def check(self, value, where):
        if not isinstance(value, list):
            return self._wrong(value, where)
        if len(value) > self.max_items:
            return f"{where} has {len(value)} items; at most {self.max_items} are allowed"
        for i, item in enumerate(value):
            problem = self.item.check(item, _at(where, i))
            if problem is not None:
                return problem
        return None


class MapOf(Schema):
    """An object with any keys fitting ``key`` (a :class:`Str`) and values fitting ``value``."""

    def __init__(self, key: Str, value: Schema, max_items: int = 1_000_000):
        self.key, self.value, self.max_items = key, value, max_items
        self.expected = "an object"

    def claims(self, value):
        return isinstance(value, dict)

    def check(self, value, where):
        if not isinstance(value, dict):
            return self._wrong(value, where)
        if len(value) > self.max_items:
            return f"{where} has {len(value)} entries; at most {self.max_items} are allowed"
        for k, v in value.items():
            problem = self.key.check(k, f"a key of {where or 'the document'}")
            if problem is None:
                problem = self.value.check(v, _at(where, k))
            if problem is not None:
                return problem
        return None


class Obj(Schema):
    """An object with the ``required`` keys, any of the ``optional`` ones, and no other key."""

    def __init__(self, required: dict[str, Schema], optional: dict[str, Schema] | None = None):
        self.required, self.optional = required, optional or {}
        self.expected = "an object" + (f" with {', '.join(map(repr, required))}" if len(required) == 1 else "")

    def claims(self, value):
        """An object holding every required key (which tells apart objects of different shapes)."""
        return isinstance(value, dict) and all(k in value for k in self.required)

    def check(self, value, where):
        if not isinstance(value, dict):
            return self._wrong(value, where)
        missing = [k for k in self.required if k not in value]
        if missing:
            return f"{where or 'the document'} lacks the key(s) {', '.join(map(repr, missing))}"
        unknown = [k for k in value if k not in self.required and k not in self.optional]
        if unknown:
            allowed = ", ".join(map(repr, [*self.required, *self.optional]))
            shown = ", ".join(repr(k)[:80] for k in unknown[:5])
            return f"{where or 'the document'} has the key(s) {shown}, which the format does not define (it has {allowed})"
        for k, schema in [*self.required.items(), *self.optional.items()]:
            if k in value:
                problem = schema.check(value[k], _at(where, k))
                if problem is not None:
                    return problem
        return None


class Either(Schema):
    """Fits one of ``options``; a value that fits none gets the error of the option of its kind."""

    def __init__(self, *options: Schema):
        self.options = options
        self.expected = " or ".join(o.expected for o in options)

    def claims(self, value):
        return any(o.claims(value) for o in self.options)

    def check(self, value, where):
        claiming = [o for o in self.options if o.claims(value)]
        problems = [o.check(value, where) for o in claiming]
        if not problems:
            return self._wrong(value, where)
        return None if None in problems else problems[0]


class Where(Schema):
    """Fits ``schema`` and then ``rule(value)``, which returns ``None`` or what is wrong."""

    def __init__(self, schema: Schema, rule: Callable[[Any], str | None]):
        self.schema, self.rule = schema, rule
        self.expected = schema.expected

    def claims(self, value):
        return self.schema.claims(value)

    def check(self, value, where):
        problem = self.schema.check(value, where)
        if problem is not None:
            return problem
        broken = self.rule(value)
        return None if broken is None else f"{where or 'the document'}: {broken}"
