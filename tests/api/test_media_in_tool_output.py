"""Images and files in a tool's output reach the text-only model as placeholders.

Codex's ``view_image`` answers a call with an ``input_image`` part: the turn goes on,
and the model reads that an image was left out instead of an empty result.
"""

from __future__ import annotations

from typing import Any

from tests.api.test_create import WEATHER_TOOL
from tests.support import MODEL, Server

PNG = (
    "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4nGNgYGD4"
    "DwABBAEAwS2OUAAAAABJRU5ErkJggg=="
)


async def _answer_with(server: Server, output: list[dict[str, Any]]) -> str:
    first = await server.client.responses.create(
        model=MODEL,
        input='call:get_weather {"city": "Paris"}',
        tools=[WEATHER_TOOL],  # type: ignore[list-item]
    )
    call = first.output[-1]
    assert call.type == "function_call"
    follow_up = await server.client.responses.create(
        model=MODEL,
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": output}],  # type: ignore[typeddict-item]
        tools=[WEATHER_TOOL],  # type: ignore[list-item]
    )
    assert follow_up.status == "completed"
    # The client's item is kept as sent: only the model's view has the placeholder.
    items = await server.client.responses.input_items.list(follow_up.id)
    sent = items.data[0]
    assert sent.type == "function_call_output"
    assert isinstance(sent.output, list) and len(sent.output) == len(output)
    return follow_up.output_text


async def test_an_image_in_a_function_output_is_a_visible_placeholder(server: Server) -> None:
    text = await _answer_with(
        server,
        [
            {"type": "input_text", "text": "the chart:"},
            {"type": "input_image", "image_url": PNG, "detail": "auto"},
        ],
    )
    assert text == "Tool result: the chart:\n[image omitted: this model reads text only]"


async def test_a_file_in_a_function_output_names_itself(server: Server) -> None:
    text = await _answer_with(
        server,
        [
            {"type": "input_file", "filename": "report.pdf", "file_data": "JVBERi0="},
            {"type": "input_text", "text": " and more"},
        ],
    )
    assert text == "Tool result: [file 'report.pdf' omitted: this model reads text only] and more"


async def test_an_image_alone_is_not_an_empty_result(server: Server) -> None:
    text = await _answer_with(server, [{"type": "input_image", "image_url": PNG}])
    assert text == "Tool result: [image omitted: this model reads text only]"
