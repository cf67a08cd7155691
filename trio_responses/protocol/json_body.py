"""The one parser of request bodies (sans-IO): strict JSON (no ``NaN``/``Infinity``),
nesting at most `MAX_JSON_DEPTH` deep, numbers Python can hold, strings that are
valid Unicode; `InvalidRequestError` naming the place otherwise."""

from __future__ import annotations

import json
import math
import re
import sys
from typing import Any, NoReturn

from .._exceptions import InvalidRequestError

# -- the JSON body ----------------------------------------------------------------------------

MAX_JSON_DEPTH = 64
"""How deeply arrays and objects may nest in a request body.

Real requests stay far below it: the deepest part is usually the JSON schema of
a tool's parameters, a handful of levels. Validation, prompt rendering and
storing a record all walk values recursively, so this also bounds their
recursion, well inside Python's.
"""

_MAX_KEY_IN_PARAM = 64
"""Longest object key repeated in an error's ``param`` (longer ones are cut)."""

_SURROGATE = re.compile("[\ud800-\udfff]")

_BAD_JSON = (
    "We could not parse the JSON body of your request. The API expects a JSON "
    "object; check that the body is valid JSON (UTF-8) and sent with "
    "'Content-Type: application/json'."
)


class _NonFiniteNumber(ValueError):
    """``NaN``, ``Infinity`` or ``-Infinity`` in a body (Python's json accepts them)."""


def _reject_constant(name: str) -> NoReturn:
    raise _NonFiniteNumber(name)


_DECODER = json.JSONDecoder(parse_constant=_reject_constant)

_Path = tuple[Any, int | str] | None
"""Where a value sits in the body: (parent path, key or index), None for the root."""


def decode_json_body(data: bytes) -> Any:
    """Decode a request body as strict JSON and check what the server cannot hold.

    The body must be UTF-8; ``NaN``/``Infinity`` and numbers that do not fit
    (``1e999``, integers longer than Python converts) are refused, so whatever
    is stored stays strict JSON; so are nesting deeper than `MAX_JSON_DEPTH`
    and lone UTF-16 surrogates (``"\\ud800"``), which no UTF-8 encoder accepts.

    CPU-bound (linear in ``len(data)``): callers run large bodies off the event loop.

    Raises:
        InvalidRequestError: code ``invalid_json``, or ``invalid_value`` with
            ``param`` naming the string that holds a surrogate.
    """
    try:
        value = _DECODER.decode(data.decode("utf-8"))
    except _NonFiniteNumber as error:
        raise InvalidRequestError(
            f"The request body contains {error}, which JSON does not allow. "
            "Send finite numbers only.",
            code="invalid_json",
        ) from None
    except RecursionError:  # the C decoder recurses once per level
        raise _too_deep(None) from None
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise InvalidRequestError(_BAD_JSON, code="invalid_json") from None
    except ValueError:  # an integer with more digits than int() converts
        raise InvalidRequestError(
            "A number in the request body has more digits than this server accepts "
            f"({sys.get_int_max_str_digits()}).",
            code="invalid_json",
        ) from None
    check_json_value(value)
    return value


def check_json_value(value: Any) -> None:
    """Raise `InvalidRequestError` for what `decode_json_body` refuses after parsing.

    An explicit stack rather than recursion, so a deep value costs no Python
    frames; each node is visited once.
    """
    if isinstance(value, str | float):
        _check_scalar(value, None)
    stack: list[tuple[Any, int, _Path]] = [(value, 1, None)]
    while stack:
        node, depth, path = stack.pop()
        if isinstance(node, dict):
            children: Any = node.items()
        elif isinstance(node, list):
            children = enumerate(node)
        else:
            continue
        if depth > MAX_JSON_DEPTH:
            raise _too_deep(path)
        for key, child in children:
            if isinstance(key, str) and not key.isascii() and _SURROGATE.search(key):
                raise _lone_surrogate((path, key))
            if isinstance(child, dict | list):
                stack.append((child, depth + 1, (path, key)))
            elif isinstance(child, str | float):
                _check_scalar(child, (path, key))


def _check_scalar(value: str | float, path: _Path) -> None:
    if isinstance(value, str):
        if not value.isascii() and _SURROGATE.search(value):
            raise _lone_surrogate(path)
    elif not math.isfinite(value):
        raise InvalidRequestError(
            f"Invalid value for {_quoted(path)}: the number is too large for this server. "
            "Send finite numbers (at most about 1.8e308).",
            param=_render(path),
            code="invalid_value",
        )


def _too_deep(path: _Path) -> InvalidRequestError:
    return InvalidRequestError(
        f"The request body nests arrays and objects more than {MAX_JSON_DEPTH} levels "
        + (f"deep (at {_quoted(path)})." if path is not None else "deep."),
        param=_render(path),
        code="invalid_json",
    )


def _lone_surrogate(path: _Path) -> InvalidRequestError:
    return InvalidRequestError(
        f"Invalid value for {_quoted(path)}: the string holds a lone UTF-16 surrogate "
        "(a \\ud800-\\udfff escape without its pair), which is not valid Unicode. "
        "Escape characters outside the BMP as surrogate pairs, or send them as UTF-8.",
        param=_render(path),
        code="invalid_value",
    )


def _render(path: _Path) -> str | None:
    """``input[0].content`` for a path; keys are made printable and cut short."""
    keys: list[int | str] = []
    while path is not None:
        path, key = path
        keys.append(key)
    rendered = ""
    for key in reversed(keys):
        if isinstance(key, int):
            rendered += f"[{key}]"
            continue
        text = printable_key(key)
        rendered += f".{text}" if rendered else text
    return rendered or None


def printable_key(key: str) -> str:
    text = key.encode("utf-8", "backslashreplace").decode("utf-8")
    return text if len(text) <= _MAX_KEY_IN_PARAM else text[:_MAX_KEY_IN_PARAM] + "…"


def _quoted(path: _Path) -> str:
    rendered = _render(path)
    return f"'{rendered}'" if rendered is not None else "the request body"
