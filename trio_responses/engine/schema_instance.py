"""A deterministic JSON value that validates against a JSON Schema (pure).

The scripted model answers constrained requests with `instance`: a structured
output (``text.format`` ``json_schema``) or the arguments of a forced tool call.
It covers what ``pydantic``'s ``model_json_schema()`` and OpenAI's strict mode
emit: ``type`` (one or a list), ``properties``/``required``/
``additionalProperties``, ``items``/``prefixItems``/``minItems``/``maxItems``/
``uniqueItems``, ``enum``, ``const``, ``anyOf``/``oneOf``/``allOf``, local
``$ref`` into ``$defs``/``definitions``, string lengths and common ``format``\\ s,
number bounds and ``multipleOf``. A ``pattern`` is honoured when the hint or the
default text matches it (there is no general regex solver).

``hint`` steers the value: wherever part of it fits the schema (an enum member,
a string of the right length, a number in range...) it is used, so a request
can say what the scripted model should answer. Objects keep the schema's
property order (grammar-constrained engines such as vLLM's xgrammar expect it).

The work is bounded whatever the schema: at most `MAX_STEPS` sub-schemas are
visited and the value is at most about `MAX_SIZE` characters of JSON, else
`SchemaTooLargeError`. A ``pattern`` runs only against strings of at most
`MAX_MATCHED` characters (`MAX_MATCHED_NESTED` where the regex nests repeats,
the shape that backtracks exponentially); longer hints are not used there.
Patterns are the client's: even on short strings a backtracking matcher can
take exponential time (``a*a*a*a*a*a*a*b`` against 60 characters takes
minutes). They run in the `regex` module, which lets other threads run while it
matches and stops after a timeout: all the matching for one value shares
`MATCH_SECONDS`, and a string whose match did not finish in time counts as not
matching.
"""

from __future__ import annotations

import functools
import math
import re
import time
from collections.abc import Mapping, Sequence
from typing import Any

import regex  # type: ignore[import-untyped]

from .._adapters import sre
from ..protocol.codec import encode_json

MAX_DEPTH = 32
"""Deeper than this (recursive ``$ref``\\ s), optional parts are left out."""

MAX_STEPS = 10_000
"""Sub-schemas visited for one value, at most (each ``anyOf`` branch counts)."""

MAX_SIZE = 64 * 1024
"""About the most characters of JSON one value may take."""

MAX_MATCHED = 256
"""The longest string a schema's ``pattern`` is run against."""

MAX_MATCHED_NESTED = 16
"""The same, for a ``pattern`` that repeats a group holding a repeat or an
alternation (such as ``^(a+)+$``, whose backtracking doubles with each character)."""

MATCH_SECONDS = 0.1
"""Time all of one value's ``pattern`` matching may take, in sum."""

_FORMATS: dict[str, tuple[str, str]] = {
    # format -> (example, a regex a hint must match to be used)
    "date-time": (
        "2026-01-01T00:00:00Z",
        r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)",
    ),
    "date": ("2026-01-01", r"\d{4}-\d\d-\d\d"),
    "time": ("00:00:00Z", r"\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)"),
    "duration": ("P1D", r"P(\d+[YMWD])*(T(\d+[HMS])+)?"),
    "email": ("user@example.com", r"[^@\s]+@[^@\s]+\.[^@\s]+"),
    "hostname": ("example.com", r"[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?"),
    "ipv4": ("192.0.2.1", r"(\d{1,3}\.){3}\d{1,3}"),
    "ipv6": ("2001:db8::1", r"[0-9A-Fa-f:]+"),
    "uri": ("https://example.com/", r"[A-Za-z][A-Za-z0-9+.-]*:[^\s]*"),
    "url": ("https://example.com/", r"[A-Za-z][A-Za-z0-9+.-]*:[^\s]*"),
    "uuid": (
        "00000000-0000-4000-8000-000000000000",
        r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}",
    ),
}


class _Missing:
    """No hint here (unlike a hint of ``null``)."""


MISSING: Any = _Missing()


class SchemaInstanceError(ValueError):
    """The schema admits no value this generator can build (``false``, a broken ``$ref``)."""


class SchemaTooLargeError(SchemaInstanceError):
    """Building a value would take more than `MAX_STEPS` steps or `MAX_SIZE` characters."""


_FAILED: Any = object()


def instance(schema: Mapping[str, Any] | bool, *, hint: Any = MISSING, text: str = "text") -> Any:
    """A value valid against ``schema``, made from ``hint`` where it fits.

    ``text`` is the default for strings. Same arguments, same value.

    Raises:
        SchemaTooLargeError: the value would be too large, or take too long to find.
        SchemaInstanceError: the schema admits nothing, or a ``$ref`` does not resolve.
    """
    root = schema if isinstance(schema, Mapping) else {}
    return _Generator(root, text).value(schema, hint, 0, 0)


def dumps(value: Any) -> str:
    """Compact JSON text of ``value`` (as a constrained model writes it)."""
    return encode_json(value)


class _Generator:
    def __init__(self, root: Mapping[str, Any], text: str) -> None:
        self._root = root
        self._text = text
        self._steps = 0
        self._size = 0
        self._targets: dict[str, Mapping[str, Any]] = {}
        self._match_deadline = time.monotonic() + MATCH_SECONDS

    def _spend(self, size: int) -> None:
        """Count one step and ``size`` characters against the budget."""
        self._steps += 1
        self._size += size
        if self._steps > MAX_STEPS:
            raise SchemaTooLargeError(
                f"building a value for this schema takes more than {MAX_STEPS} steps "
                "(deeply recursive anyOf/oneOf/$ref)"
            )
        if self._size > MAX_SIZE:
            raise SchemaTooLargeError(
                f"the smallest value this schema admits is over {MAX_SIZE} characters "
                "(minItems, minLength, minProperties or pattern repeats too large)"
            )

    def value(self, schema: Mapping[str, Any] | bool, hint: Any, depth: int, variant: int) -> Any:
        if schema is True:
            return None if hint is MISSING else hint
        if schema is False:
            raise SchemaInstanceError("the schema 'false' admits no value")
        if not isinstance(schema, Mapping):
            raise SchemaInstanceError(f"a schema must be an object or a boolean, not {schema!r}")
        if depth > MAX_DEPTH * 2:
            raise SchemaInstanceError("the schema nests (or recurses) too deeply")
        self._spend(1)
        schema = self._resolved(schema, depth)
        if "const" in schema:
            return schema["const"]
        if "enum" in schema:
            return self._enum(schema["enum"], hint, variant)
        if "allOf" in schema:
            return self.value(_merged(schema), hint, depth + 1, variant)
        for key in ("anyOf", "oneOf"):
            if key in schema:
                return self._branch(schema, schema[key], hint, depth, variant)
        kind = self._type(schema, hint)
        if kind == "object":
            return self._object(schema, hint, depth, variant)
        if kind == "array":
            return self._array(schema, hint, depth, variant)
        if kind == "string":
            return self._string(schema, hint, variant)
        if kind == "integer":
            return self._integer(schema, hint, variant)
        if kind == "number":
            return self._number(schema, hint, variant)
        if kind == "boolean":
            return hint if isinstance(hint, bool) else variant % 2 == 1
        if kind == "null":
            return None
        return self._text if hint is MISSING else hint  # no type: anything goes

    # -- composition ---------------------------------------------------------------------

    def _resolved(self, schema: Mapping[str, Any], depth: int) -> Mapping[str, Any]:
        seen = 0
        while isinstance(schema.get("$ref"), str):
            target = self._pointer(schema["$ref"])
            rest = {key: value for key, value in schema.items() if key != "$ref"}
            schema = {**target, **rest} if rest else target
            seen += 1
            if seen > MAX_DEPTH:
                raise SchemaInstanceError("the schema's $ref chain does not end")
        return schema

    def _pointer(self, ref: str) -> Mapping[str, Any]:
        if ref not in self._targets:
            self._targets[ref] = self._lookup(ref)
        return self._targets[ref]

    def _lookup(self, ref: str) -> Mapping[str, Any]:
        if not ref.startswith("#"):
            raise SchemaInstanceError(f"only local $ref values are supported, not {ref!r}")
        node: Any = self._root
        for part in ref[1:].lstrip("/").split("/") if ref not in ("#", "#/") else []:
            key = part.replace("~1", "/").replace("~0", "~")
            if isinstance(node, Mapping) and key in node:
                node = node[key]
            elif isinstance(node, list) and key.isdigit() and int(key) < len(node):
                node = node[int(key)]
            else:
                raise SchemaInstanceError(f"$ref {ref!r} does not resolve")
        if node is True:
            return {}
        if not isinstance(node, Mapping):
            raise SchemaInstanceError(f"$ref {ref!r} does not name a schema")
        return node

    def _enum(self, values: Sequence[Any], hint: Any, variant: int) -> Any:
        if not values:
            raise SchemaInstanceError("an empty enum admits no value")
        for value in values:
            if value == hint and type(value) is type(hint):
                return value
        return values[variant % len(values)]

    def _branch(
        self,
        schema: Mapping[str, Any],
        branches: Sequence[Any],
        hint: Any,
        depth: int,
        variant: int,
    ) -> Any:
        rest = {k: v for k, v in schema.items() if k not in ("anyOf", "oneOf")}
        options = [{**rest, **b} if isinstance(b, Mapping) else b for b in branches]
        built: dict[int, Any] = {}

        def attempt(index: int) -> Any:
            """The value of branch ``index``, built once (`_FAILED` if it admits none)."""
            if index not in built:
                try:
                    built[index] = self.value(options[index], hint, depth + 1, variant)
                except SchemaTooLargeError:
                    raise
                except SchemaInstanceError:
                    built[index] = _FAILED
            return built[index]

        if hint is not MISSING:
            for index in range(len(options)):
                value = attempt(index)
                if value is not _FAILED and value == hint:
                    return value
        # Prefer a branch that says something over null (Optional[X] -> X).
        nulls = [
            isinstance(option, Mapping) and self._resolved(option, depth).get("type") == "null"
            for option in options
        ]
        for index in sorted(range(len(options)), key=lambda i: nulls[i]):
            value = attempt(index)
            if value is not _FAILED:
                return value
        raise SchemaInstanceError("no branch of anyOf/oneOf admits a value")

    def _type(self, schema: Mapping[str, Any], hint: Any) -> str | None:
        declared = schema.get("type")
        if isinstance(declared, str):
            return declared
        if isinstance(declared, list) and declared:
            actual = _json_type(hint)
            if actual in declared or (actual == "integer" and "number" in declared):
                return actual
            named = [str(t) for t in declared]
            return next((t for t in named if t != "null"), named[0])
        # No type: infer from the keywords present.
        if "properties" in schema or "required" in schema or "additionalProperties" in schema:
            return "object"
        if "items" in schema or "prefixItems" in schema:
            return "array"
        if any(k in schema for k in ("minLength", "maxLength", "pattern", "format")):
            return "string"
        if any(k in schema for k in ("minimum", "maximum", "multipleOf")):
            return "number"
        return None

    # -- structures ----------------------------------------------------------------------

    def _object(
        self, schema: Mapping[str, Any], hint: Any, depth: int, variant: int
    ) -> dict[str, Any]:
        given: Mapping[str, Any] = hint if isinstance(hint, Mapping) else {}
        properties: Mapping[str, Any] = schema.get("properties") or {}
        required = [str(name) for name in schema.get("required") or []]
        result: dict[str, Any] = {}
        for name, sub in properties.items():
            if name in required or name in given:
                result[name] = self.value(sub, given.get(name, MISSING), depth + 1, variant)
        for name in required:  # required but not described: anything goes
            if name not in result:
                result[name] = given.get(name, self._text)
        # Unlisted keys only where the schema asks for them or lists none (strict
        # grammars, like xgrammar's, read a missing additionalProperties as false).
        extra = schema.get("additionalProperties", not properties)
        if extra is not False:
            for name, sub_hint in given.items():
                if name not in result and name not in properties:
                    sub = extra if isinstance(extra, Mapping) else True
                    result[name] = self.value(sub, sub_hint, depth + 1, 0)
        minimum = int(schema.get("minProperties", 0))
        self._spend(min(minimum, MAX_SIZE + 1) * 4)
        for name, sub in properties.items():
            if len(result) >= minimum:
                break
            if name not in result:
                result[name] = self.value(sub, MISSING, depth + 1, variant)
        return result

    def _array(self, schema: Mapping[str, Any], hint: Any, depth: int, variant: int) -> list[Any]:
        given = list(hint) if isinstance(hint, list) else []
        prefix = schema.get("prefixItems")
        items = schema.get("items", True)
        if isinstance(items, list):  # draft 4-7 tuple form
            prefix, items = items, schema.get("additionalItems", True)
        prefix = list(prefix or [])
        low = int(schema.get("minItems", 0))
        self._spend(min(low, MAX_SIZE + 1))
        high = schema.get("maxItems")
        count = len(given) if given else max(low, len(prefix), 1 if depth < 4 else 0)
        count = max(count, low, len(prefix) if items is False else 0)
        if high is not None:
            count = min(count, int(high))
        if items is False:
            count = min(count, len(prefix))
        unique = bool(schema.get("uniqueItems"))
        result: list[Any] = []
        self._spend(count)
        for index in range(count):
            sub = prefix[index] if index < len(prefix) else items
            sub_hint = given[index] if index < len(given) else MISSING
            value = self.value(sub, sub_hint, depth + 1, variant + index if unique else variant)
            shift = 1
            while unique and value in result and shift <= 16:
                value = self.value(sub, MISSING, depth + 1, variant + index + shift)
                shift += 1
            if unique and value in result:
                if len(result) >= low:
                    continue  # no other value to be had: a shorter array still fits
                raise SchemaInstanceError("uniqueItems: not enough distinct values")
            result.append(value)
        return result

    # -- scalars ------------------------------------------------------------------------

    def _string(self, schema: Mapping[str, Any], hint: Any, variant: int) -> str:
        value = self._string_value(schema, hint, variant)
        self._spend(len(value) + 2)
        return value

    def _string_value(self, schema: Mapping[str, Any], hint: Any, variant: int) -> str:
        low = int(schema.get("minLength", 0))
        self._spend(min(low, MAX_SIZE + 1))
        high = schema.get("maxLength")
        pattern = schema.get("pattern")
        form = schema.get("format")
        known = _FORMATS.get(form) if isinstance(form, str) else None

        def fits(value: str) -> bool:
            if len(value) < low or (high is not None and len(value) > int(high)):
                return False
            if known is not None and (
                len(value) > MAX_MATCHED or not re.fullmatch(known[1], value)
            ):
                return False
            return not (
                isinstance(pattern, str) and not _search(pattern, value, self._match_deadline)
            )

        if isinstance(hint, str) and fits(hint):
            return hint
        base = known[0] if known is not None else self._text
        if variant and known is None:
            base = f"{base} {variant}"
        candidates = [base, base[: int(high)] if high is not None else base]
        if isinstance(pattern, str):
            candidates.extend(_matching(pattern, variant, self._match_deadline))
        candidates.extend([self._text, "a", "A", "0", "a0", "x" * max(low, 1), ""])
        for candidate in candidates:
            if fits(candidate):
                return candidate
        # Fit the length: cut, or pad with the text itself.
        value = base
        if high is not None:
            value = value[: int(high)]
        while len(value) < low:
            value += (" " + base) if base else "x"
        value = value[: int(high)] if high is not None else value
        return value if len(value) >= low else value + "x" * (low - len(value))

    def _integer(self, schema: Mapping[str, Any], hint: Any, variant: int) -> int:
        low, high = _bounds(schema, integer=True)
        step = schema.get("multipleOf")
        if isinstance(hint, int) and not isinstance(hint, bool) and _in(hint, low, high, step):
            return hint
        value = variant
        if low is not None and value < low:
            value = math.ceil(low)
        if high is not None and value > high:
            value = math.floor(high)
        if isinstance(step, (int, float)) and step > 0:
            value = int(math.ceil((value if low is None else max(value, low)) / step) * step)
            if high is not None and value > high:
                value = int(math.floor(high / step) * step)
        return int(value)

    def _number(self, schema: Mapping[str, Any], hint: Any, variant: int) -> int | float:
        low, high = _bounds(schema, integer=False)
        step = schema.get("multipleOf")
        if (
            isinstance(hint, (int, float))
            and not isinstance(hint, bool)
            and math.isfinite(hint)
            and _in(hint, low, high, step)
        ):
            return hint
        if isinstance(step, (int, float)) and step > 0:
            return (
                self._integer(schema, None, variant)
                if float(step).is_integer()
                else _multiple(low, high, float(step), variant)
            )
        value: float = variant
        if low is not None and value < low:
            value = low
        if high is not None and value > high:
            value = high
        if low is not None and high is not None and low > high:
            raise SchemaInstanceError("the number bounds admit no value")
        return int(value) if float(value).is_integer() else value


def _bounds(schema: Mapping[str, Any], *, integer: bool) -> tuple[float | None, float | None]:
    """Inclusive bounds from minimum/maximum and the exclusive forms (drafts 4 and 6+)."""
    low: float | None = _number_or_none(schema.get("minimum"))
    high: float | None = _number_or_none(schema.get("maximum"))
    bump = 1.0 if integer else 1e-6
    exclusive_low = schema.get("exclusiveMinimum")
    exclusive_high = schema.get("exclusiveMaximum")
    if exclusive_low is True and low is not None:
        low = _above(low, integer, bump)
    elif (value := _number_or_none(exclusive_low)) is not None:
        low = (
            _above(value, integer, bump) if low is None else max(low, _above(value, integer, bump))
        )
    if exclusive_high is True and high is not None:
        high = _below(high, integer, bump)
    elif (value := _number_or_none(exclusive_high)) is not None:
        below = _below(value, integer, bump)
        high = below if high is None else min(high, below)
    return low, high


def _above(value: float, integer: bool, bump: float) -> float:
    return math.floor(value) + 1 if integer else value + max(bump, abs(value) * 1e-9)


def _below(value: float, integer: bool, bump: float) -> float:
    return math.ceil(value) - 1 if integer else value - max(bump, abs(value) * 1e-9)


def _number_or_none(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _in(value: float, low: float | None, high: float | None, step: Any) -> bool:
    if low is not None and value < low:
        return False
    if high is not None and value > high:
        return False
    if isinstance(step, (int, float)) and step > 0:
        quotient = value / step
        return abs(quotient - round(quotient)) < 1e-9
    return True


def _multiple(low: float | None, high: float | None, step: float, variant: int) -> float:
    start = variant if low is None else max(variant, low)
    value = math.ceil(start / step) * step
    if high is not None and value > high:
        value = math.floor(high / step) * step
    return round(value, 12)


def _merged(schema: Mapping[str, Any]) -> dict[str, Any]:
    """``allOf`` folded into one schema (properties and required united)."""
    merged: dict[str, Any] = {k: v for k, v in schema.items() if k != "allOf"}
    for part in schema["allOf"]:
        if not isinstance(part, Mapping):
            continue
        for key, value in part.items():
            if key == "properties" and isinstance(value, Mapping):
                merged["properties"] = {**merged.get("properties", {}), **value}
            elif key == "required" and isinstance(value, list):
                merged["required"] = [*merged.get("required", []), *value]
            else:
                merged.setdefault(key, value)
    return merged


def _json_type(value: Any) -> str | None:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, Mapping):
        return "object"
    return None


def _matching(pattern: str, variant: int, deadline: float) -> list[str]:
    """Short strings that match ``pattern`` (simple regexes; [] when it cannot tell)."""
    try:
        parsed = sre.parse(pattern)
    except (re.error, RecursionError):
        return []
    found = []
    for repeat in (0, 1, 3):
        try:
            text = _regex_text(parsed, repeat, variant)
        except (ValueError, RecursionError):
            continue
        if _search(pattern, text, deadline):
            found.append(text)
    return found


def regex_instance(pattern: str, *, nonempty: bool = False) -> str | None:
    """A short string the whole of ``pattern`` matches (simple regexes; None when it
    cannot tell). ``nonempty``: not the empty string, where it can."""
    try:
        parsed = sre.parse(pattern)
        compiled = re.compile(pattern)
    except (re.error, RecursionError, OverflowError):
        return None
    for repeat in (1, 0, 3):
        try:
            text = _regex_text(parsed, repeat, 0)
        except (ValueError, RecursionError):
            continue
        if (text or not nonempty) and compiled.fullmatch(text) is not None:
            return text
    return None


def _regex_text(items: list[sre.Node], repeat: int, variant: int) -> str:
    """One string the parsed regex ``items`` match: each repeat at least ``repeat`` times."""
    out: list[str] = []
    for name, arg in items:
        if name == "LITERAL":
            out.append(chr(arg))
        elif name == "ANY":
            out.append("a")
        elif name == "NOT_LITERAL":
            out.append("b" if arg == ord("a") else "a")
        elif name == "IN":
            out.append(_class_char(arg))
        elif name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"):
            low, high, sub = arg
            count = max(low, min(repeat, high))
            part = _regex_text(sub, repeat, variant)
            if len(part) * count > MAX_MATCHED:
                raise ValueError("a repeat too long to write out")
            out.append(part * count)
        elif name in ("SUBPATTERN", "ATOMIC_GROUP"):
            out.append(_regex_text(arg, repeat, variant))
        elif name == "BRANCH":
            out.append(_regex_text(arg[variant % len(arg)], repeat, variant))
        elif name == "CATEGORY":
            out.append(_category_char(arg))
        elif name in ("AT", "ASSERT", "ASSERT_NOT"):
            continue
        else:
            raise ValueError(name)
    text = "".join(out)
    if len(text) > MAX_MATCHED:
        raise ValueError("a match too long to write out")
    return text


def _class_char(items: list[sre.Node]) -> str:
    if items and items[0][0] == "NEGATE":
        for candidate in "a0A_ -":
            if not _class_has(items[1:], candidate):
                return candidate
        raise ValueError("negated class")
    for name, arg in items:
        if name == "LITERAL":
            return chr(arg)
        if name == "RANGE":
            return chr(arg[0])
        if name == "CATEGORY":
            return _category_char(arg)
    raise ValueError("empty class")


def _class_has(items: list[sre.Node], char: str) -> bool:
    for name, arg in items:
        if name == "LITERAL" and chr(arg) == char:
            return True
        if name == "RANGE" and arg[0] <= ord(char) <= arg[1]:
            return True
        if name == "CATEGORY" and re.fullmatch(_CATEGORIES.get(arg, "$^"), char):
            return True
    return False


_CATEGORIES = {
    "CATEGORY_DIGIT": r"\d",
    "CATEGORY_NOT_DIGIT": r"\D",
    "CATEGORY_WORD": r"\w",
    "CATEGORY_NOT_WORD": r"\W",
    "CATEGORY_SPACE": r"\s",
    "CATEGORY_NOT_SPACE": r"\S",
}


def _category_char(category: str) -> str:
    return {
        "CATEGORY_DIGIT": "0",
        "CATEGORY_NOT_DIGIT": "a",
        "CATEGORY_WORD": "a",
        "CATEGORY_NOT_WORD": "-",
        "CATEGORY_SPACE": " ",
        "CATEGORY_NOT_SPACE": "a",
    }.get(category, "a")


def _search(pattern: str, value: str, deadline: float) -> bool:
    """Whether ``pattern`` matches somewhere in ``value``; False for a ``value`` too
    long to run the pattern against safely (`MAX_MATCHED`, `MAX_MATCHED_NESTED`)
    and when the match is not over by ``deadline`` (`time.monotonic`)."""
    if len(value) > MAX_MATCHED_NESTED and (len(value) > MAX_MATCHED or _nests_repeats(pattern)):
        return False
    left = deadline - time.monotonic()
    if left <= 0 or _expands_too_far(pattern):
        return False
    try:
        return regex.search(pattern, value, timeout=left, concurrent=True) is not None
    except TimeoutError:
        return False
    except (regex.error, RecursionError, OverflowError):
        return True  # a pattern that cannot be read is not held against the value


MAX_EXPANDED = 10_000
"""The most pattern elements a regex may stand for once its counted repeats are
written out (``(?:a{1000}){1000}``: a million), which is what compiling it costs
the `regex` module in time and memory (about half a microsecond each)."""


@functools.lru_cache(maxsize=256)
def _expands_too_far(pattern: str) -> bool:
    """Whether ``pattern``'s counted repeats, written out, exceed `MAX_EXPANDED`."""
    try:
        parsed = sre.parse(pattern)
    except (re.error, RecursionError, OverflowError):
        return False  # not Python's syntax: `_search` lets the regex module judge
    try:
        return _expanded(parsed) > MAX_EXPANDED
    except RecursionError:
        return True


def _expanded(items: list[sre.Node]) -> int:
    total = 0
    for name, arg in items:
        if name in _REPEATS:
            low, _high, sub = arg
            total += max(low, 1) * _expanded(sub)
        elif name == "BRANCH":
            total += sum(_expanded(branch) for branch in arg)
        elif name in ("SUBPATTERN", "ATOMIC_GROUP", "ASSERT", "ASSERT_NOT"):
            total += _expanded(arg)
        else:
            total += 1
        if total > MAX_EXPANDED:
            return total
    return total


@functools.lru_cache(maxsize=256)
def _nests_repeats(pattern: str) -> bool:
    """Whether ``pattern`` repeats a group that holds a repeat or an alternation."""
    try:
        parsed = sre.parse(pattern)
    except (re.error, RecursionError, OverflowError):
        return True
    return _has_nested(parsed, inside_repeat=False)


_REPEATS = ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT")


def _has_nested(items: list[sre.Node], *, inside_repeat: bool) -> bool:
    for name, arg in items:
        if name in _REPEATS:
            if inside_repeat:
                return True
            if _has_nested(arg[2], inside_repeat=True):
                return True
        elif name == "BRANCH":
            if inside_repeat:
                return True
            if any(_has_nested(b, inside_repeat=False) for b in arg):
                return True
        elif name in ("SUBPATTERN", "ATOMIC_GROUP", "ASSERT", "ASSERT_NOT") and _has_nested(
            arg, inside_repeat=inside_repeat
        ):
            return True
    return False
