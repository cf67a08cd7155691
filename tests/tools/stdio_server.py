"""An MCP server on stdio for fault tests: echo, and die (exits mid-call)."""

import os

import anyio
from mcp.server.mcpserver import MCPServer

server = MCPServer("faulty")


@server.tool(description="Say the text back.")
def echo(text: str) -> str:
    return f"echo: {text}"


@server.tool(description="Exit the server process in the middle of the call.")
async def die() -> str:
    os._exit(3)


if __name__ == "__main__":
    anyio.run(server.run_stdio_async, backend="trio")
