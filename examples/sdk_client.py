"""Talk to a running trio-responses server with the official openai SDK.

trio-responses serve &                    # scripted engine on 127.0.0.1:8000
python examples/sdk_client.py [BASE_URL]  # default http://127.0.0.1:8000/v1
"""

from __future__ import annotations

import json
import sys

from openai import OpenAI


def main(base_url: str) -> None:
    client = OpenAI(base_url=base_url, api_key="unused")
    model = client.models.list().data[0].id

    response = client.responses.create(model=model, input="hello")
    print("plain:", response.output_text)

    print("stream: ", end="")
    with client.responses.stream(model=model, input="tokens:8") as stream:
        for event in stream:
            if event.type == "response.output_text.delta":
                print(event.delta, end="", flush=True)
        print(" ->", stream.get_final_response().status)

    tools = [
        {
            "type": "function",
            "name": "get_weather",
            "description": "Current weather for a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        }
    ]
    first = client.responses.create(
        model=model, input='call:get_weather {"city": "Paris"}', tools=tools
    )
    call = first.output[-1]
    assert call.type == "function_call"
    print("function call:", call.name, json.loads(call.arguments))
    second = client.responses.create(
        model=model,
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}],
        tools=tools,
    )
    print("answer:", second.output_text)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8000/v1")
