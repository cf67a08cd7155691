"""The HTTP routes of the Files and Containers APIs (``/v1/files…``, ``/v1/containers…``).

Thin handlers over `ResponsesService.files` (``_files.py``), registered by
`create_app` with `add_file_routes`. The caller's owner scopes every operation.
Uploads are ``multipart/form-data`` (what the SDK sends), parsed off the event loop
from the body the pipeline read within ``--max-body-bytes``; file contents go back
as ``application/octet-stream`` with the file's name.
"""

from __future__ import annotations

import io
from functools import partial
from typing import Any, Literal

from quart import Response, request
from quart_trio import QuartTrio
from werkzeug.datastructures import FileStorage, MultiDict
from werkzeug.exceptions import HTTPException
from werkzeug.formparser import FormDataParser
from werkzeug.http import parse_options_header

from .._exceptions import InvalidRequestError
from .._files import Upload
from .._offload import offload
from .._service import ResponsesService
from ..protocol.json_body import decode_json_body
from .common import integer, json_response, shown
from .request_state import caller

MAX_FORM_PARTS = 16
"""Most parts a multipart upload may have (a file and a few fields)."""


def add_file_routes(app: QuartTrio, service: ResponsesService) -> None:
    """Register the ``/v1/files`` and ``/v1/containers`` routes on ``app``."""
    files = service.files
    limit = service.config.max_body_bytes

    @app.post("/v1/files")
    async def create_file() -> Response:
        form, upload = await _multipart(limit)
        purpose = form.get("purpose")
        return json_response(await files.create_file(upload, purpose, owner=caller()))

    @app.get("/v1/files")
    async def list_files() -> Response:
        args = request.args
        return json_response(
            await files.list_files(
                owner=caller(),
                after=args.get("after"),
                limit=integer(args.get("limit", "10000"), "limit"),
                order=_order(),
                purpose=args.get("purpose"),
            )
        )

    @app.get("/v1/files/<file_id>")
    async def retrieve_file(file_id: str) -> Response:
        return json_response(await files.retrieve_file(file_id, owner=caller()))

    @app.get("/v1/files/<file_id>/content")
    async def file_content(file_id: str) -> Response:
        return _content(*await files.file_content(file_id, owner=caller()))

    @app.delete("/v1/files/<file_id>")
    async def delete_file(file_id: str) -> Response:
        return json_response(await files.delete_file(file_id, owner=caller()))

    @app.post("/v1/containers")
    async def create_container() -> Response:
        body = await _json_body()
        return json_response(await files.create_container(body, owner=caller()))

    @app.get("/v1/containers")
    async def list_containers() -> Response:
        args = request.args
        return json_response(
            await files.list_containers(
                owner=caller(),
                after=args.get("after"),
                limit=integer(args.get("limit", "20"), "limit"),
                order=_order(),
            )
        )

    @app.get("/v1/containers/<container_id>")
    async def retrieve_container(container_id: str) -> Response:
        return json_response(await files.retrieve_container(container_id, owner=caller()))

    @app.delete("/v1/containers/<container_id>")
    async def delete_container(container_id: str) -> Response:
        return json_response(await files.delete_container(container_id, owner=caller()))

    @app.post("/v1/containers/<container_id>/files")
    async def create_container_file(container_id: str) -> Response:
        upload: Upload | None = None
        file_id: Any = None
        if request.mimetype == "multipart/form-data":
            form, upload = await _multipart(limit)
            file_id = form.get("file_id")
        else:
            body = await _json_body()
            if not isinstance(body, dict):
                raise InvalidRequestError(
                    "The request body must be a JSON object.", code="invalid_type"
                )
            file_id = body.get("file_id")
            if file_id is not None and not isinstance(file_id, str):
                raise InvalidRequestError(
                    "Invalid type for 'file_id': expected a string.",
                    param="file_id",
                    code="invalid_type",
                )
        return json_response(
            await files.create_container_file(
                container_id, upload=upload, file_id=file_id, owner=caller()
            )
        )

    @app.get("/v1/containers/<container_id>/files")
    async def list_container_files(container_id: str) -> Response:
        args = request.args
        return json_response(
            await files.list_container_files(
                container_id,
                owner=caller(),
                after=args.get("after"),
                limit=integer(args.get("limit", "20"), "limit"),
                order=_order(),
            )
        )

    @app.get("/v1/containers/<container_id>/files/<file_id>")
    async def retrieve_container_file(container_id: str, file_id: str) -> Response:
        return json_response(
            await files.retrieve_container_file(container_id, file_id, owner=caller())
        )

    @app.get("/v1/containers/<container_id>/files/<file_id>/content")
    async def container_file_content(container_id: str, file_id: str) -> Response:
        return _content(*await files.container_file_content(container_id, file_id, owner=caller()))

    @app.delete("/v1/containers/<container_id>/files/<file_id>")
    async def delete_container_file(container_id: str, file_id: str) -> Response:
        return json_response(
            await files.delete_container_file(container_id, file_id, owner=caller())
        )


async def _json_body() -> Any:
    data = await request.get_data(cache=False, as_text=False, parse_form_data=False)
    return await offload(len(data), partial(decode_json_body, data))


async def _multipart(limit: int) -> tuple[MultiDict[str, str], Upload | None]:
    """The form fields and the ``file`` part of a ``multipart/form-data`` body.

    Raises:
        InvalidRequestError: not multipart, or a body that does not parse.
    """
    mimetype, options = parse_options_header(request.headers.get("Content-Type", ""))
    if mimetype != "multipart/form-data" or "boundary" not in options:
        raise InvalidRequestError(
            "Send the file as multipart/form-data (a 'file' part).",
            param="file",
            code="invalid_type",
        )
    data = await request.get_data(cache=False, as_text=False, parse_form_data=False)
    try:
        form, parts = await offload(
            len(data), partial(_parse_multipart, data, mimetype, options, limit)
        )
    except (ValueError, HTTPException) as error:
        raise InvalidRequestError(
            f"The multipart body does not parse: {shown(str(error))}.",
            param="file",
            code="invalid_value",
        ) from None
    file = parts.get("file")
    if file is None:
        return form, None
    return form, Upload(file[0], file[1])


def _parse_multipart(
    data: bytes, mimetype: str, options: dict[str, str], limit: int
) -> tuple[MultiDict[str, str], dict[str, tuple[str, bytes]]]:
    """Parse a multipart body (pure work: run off the loop for large bodies)."""
    parser = FormDataParser(
        max_form_memory_size=64 * 1024,
        max_content_length=limit,
        silent=False,
        max_form_parts=MAX_FORM_PARTS,
    )
    _, form, files = parser.parse(io.BytesIO(data), mimetype, len(data), options)
    parts: dict[str, tuple[str, bytes]] = {}
    for name, storage in files.items():
        if isinstance(storage, FileStorage):
            try:
                parts[name] = (storage.filename or "file", storage.read())
            finally:
                storage.close()
    return form, parts


def _content(content: bytes, filename: str) -> Response:
    quoted = filename.replace("\\", "_").replace('"', "_")
    ascii_name = quoted.encode("ascii", "replace").decode().replace("?", "_")
    return Response(
        content,
        mimetype="application/octet-stream",
        headers={"Content-Disposition": f'attachment; filename="{ascii_name}"'},
    )


def _order() -> Literal["asc", "desc"]:
    value = request.args.get("order", "desc")
    if value not in ("asc", "desc"):
        raise InvalidRequestError(
            f"Invalid 'order': {shown(value)}; expected 'asc' or 'desc'.",
            param="order",
            code="invalid_value",
        )
    return "asc" if value == "asc" else "desc"
