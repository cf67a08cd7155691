"""Checking a client's JSON Schema (``text.format``, a function's ``parameters``)."""

from __future__ import annotations

from typing import Any

from .._exceptions import InvalidRequestError


def load_schema_checker() -> None:
    """Make the first `check_json_schema` as quick as the next: it imports the JSON
    Schema library and builds its meta-schema checks, about half a second that
    a request handled on the event loop should not wait for (call it once, off
    the loop, at start-up)."""
    check_json_schema({"type": "object"}, param="schema", what="a start-up check")


def check_json_schema(schema: dict[str, Any], *, param: str, what: str) -> None:
    """Raise `InvalidRequestError` unless ``schema`` is a valid JSON Schema.

    Checked against its draft's meta-schema (2020-12 unless ``$schema`` says
    otherwise), and every local ``$ref`` must resolve: the engine constrains
    output to it.
    """
    from jsonschema import exceptions, validators  # type: ignore[import-untyped]

    validator = validators.validator_for(schema, default=validators.Draft202012Validator)
    try:
        validator.check_schema(schema)
    except exceptions.SchemaError as error:
        where = "/".join(str(part) for part in error.absolute_path)
        raise InvalidRequestError(
            f"Invalid JSON schema for {what}: {error.message}"
            + (f" (at '{where}')" if where else "")
            + ".",
            param=param,
            code="invalid_json_schema",
        ) from None
    for ref in _local_refs(schema):
        if not ref.startswith("#"):
            raise InvalidRequestError(
                f"Invalid JSON schema for {what}: $ref {ref!r} is not local; only "
                "references into the schema itself ('#/$defs/...') are supported.",
                param=param,
                code="invalid_json_schema",
            )
        node: Any = schema
        for part in ref[1:].lstrip("/").split("/") if ref.strip("#/") else []:
            key = part.replace("~1", "/").replace("~0", "~")
            if isinstance(node, dict) and key in node:
                node = node[key]
            elif isinstance(node, list) and key.isdigit() and int(key) < len(node):
                node = node[int(key)]
            else:
                raise InvalidRequestError(
                    f"Invalid JSON schema for {what}: $ref {ref!r} does not resolve "
                    "(define it under '$defs').",
                    param=param,
                    code="invalid_json_schema",
                )


def _local_refs(node: Any) -> list[str]:
    """Every ``$ref`` in the schema (not inside values such as ``enum``)."""
    if isinstance(node, dict):
        found = [node["$ref"]] if isinstance(node.get("$ref"), str) else []
        for key, value in node.items():
            if key not in ("const", "enum", "default", "examples"):
                found.extend(_local_refs(value))
        return found
    if isinstance(node, list):
        return [ref for value in node for ref in _local_refs(value)]
    return []
