"""OpenAI's Codex CLI (``codex exec --json``, npm ``@openai/codex`` pinned in
``tests/clients/codex/package-lock.json``) driving the server (scripted engine).

Each test gives Codex its own home (``CODEX_HOME``, a ``config.toml`` naming the
server as a provider with ``wire_api = "responses"``) and workspace, runs the real
binary and reads the events it prints. Two configurations:

* the *minimal* one, ``base_url`` and ``wire_api`` only: Codex does not ask the
  server about the model and works with its fallback metadata (and says so);
* the *documented* one (docs/clients.md) adds an ``auth`` command: then Codex reads
  ``/v1/models``, finds the model's card (`protocol.model_cards`) and uses gpt-oss's
  reasoning levels, context window and tools (``apply_patch`` as a custom tool with
  its grammar, client ``tool_search``).

The scripted model acts on directives in the prompt (``call:NAME {json}``,
``custom:NAME <<<INPUT>>>``, ``search:QUERY``), so each tool Codex offers is called
exactly as a model would call it, and Codex runs it.
"""

from __future__ import annotations

import base64
import json
import os
import pathlib
from dataclasses import dataclass
from typing import Any

import pytest
import trio

from tests.clients.node import npm_ci
from tests.conftest import StartServer
from tests.support import Server
from tests.tools.web_fakes import WebFakes, serve_web_fakes

CODEX_DIR = pathlib.Path(__file__).parent / "codex"
CODEX = CODEX_DIR / "node_modules" / ".bin" / "codex"
NAMES = ("gpt-oss-20b", "openai/gpt-oss-120b", "gpt-oss:20b")
"""Names gpt-oss is served as: Codex must find each one's card."""
FALLBACK_WARNING = "Model metadata for"
PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
)


@pytest.fixture(scope="session")
def codex_binary() -> pathlib.Path:
    """The pinned Codex binary (``npm ci`` in tests/clients/codex when missing)."""
    if not CODEX.exists():
        npm_ci(CODEX_DIR)
    return CODEX


@dataclass
class Run:
    """What one ``codex exec --json`` printed."""

    events: list[dict[str, Any]]

    @property
    def thread_id(self) -> str:
        return str(next(e["thread_id"] for e in self.events if e["type"] == "thread.started"))

    def items(self, kind: str) -> list[dict[str, Any]]:
        """The completed items of one type (``agent_message``, ``command_execution``...)."""
        return [
            e["item"]
            for e in self.events
            if e["type"] == "item.completed" and e["item"]["type"] == kind
        ]

    @property
    def answer(self) -> str:
        return str(self.items("agent_message")[-1]["text"])

    @property
    def usage(self) -> dict[str, int]:
        usage: dict[str, int] = next(
            e["usage"] for e in self.events if e["type"] == "turn.completed"
        )
        return usage

    @property
    def warnings(self) -> list[str]:
        return [str(item["message"]) for item in self.items("error")]


class Codex:
    """Codex configured for one server, with its own home and workspace."""

    def __init__(
        self, binary: pathlib.Path, root: pathlib.Path, server: Server, model: str, *, card: bool
    ) -> None:
        self.binary = binary
        self.home = root / "codex-home"
        self.work = root / "work"
        # Codex keeps its sandbox helper in its home and refuses a home inside the
        # temporary directory: give it one of its own beside the home.
        self.tmp = root / "tmp"
        for path in (self.home, self.work, self.tmp):
            path.mkdir()
        config = [
            f'model = "{model}"',
            'model_provider = "trio"',
            "",
            "[model_providers.trio]",
            'name = "trio-responses"',
            f'base_url = "{server.base_url}"',
            'wire_api = "responses"',
        ]
        if card:
            config += ["", "[model_providers.trio.auth]", 'command = "printf"', 'args = ["unused"]']
        (self.home / "config.toml").write_text("\n".join(config) + "\n")

    async def exec(self, prompt: str, *options: str, resume: str | None = None) -> Run:
        command = [str(self.binary), "exec", "--json", "--skip-git-repo-check"]
        command += ["--sandbox", "workspace-write", *options]
        if resume is not None:
            command += ["resume", resume]
        command.append(prompt)
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(self.home),
            "CODEX_HOME": str(self.home),
            "TMPDIR": str(self.tmp),
            "NO_COLOR": "1",
        }
        with trio.fail_after(180):
            done = await trio.run_process(
                command,
                cwd=self.work,
                env=env,
                stdin=b"",
                capture_stdout=True,
                capture_stderr=True,
                check=False,
            )
        stderr = done.stderr.decode(errors="replace")
        assert done.returncode == 0, f"codex exec failed ({done.returncode}):\n{stderr[-4000:]}"
        lines = done.stdout.decode().splitlines()
        events = [json.loads(line) for line in lines if line.startswith("{")]
        assert any(e["type"] == "turn.completed" for e in events), f"{events}\n{stderr[-4000:]}"
        return Run(events)


async def _codex(
    start_server: StartServer,
    binary: pathlib.Path,
    tmp_path: pathlib.Path,
    *,
    model: str = NAMES[0],
    card: bool = True,
    **config: Any,
) -> Codex:
    server = await start_server(served_model_names=NAMES, **config)
    return Codex(binary, tmp_path, server, model, card=card)


@pytest.mark.parametrize("model", NAMES)
async def test_a_plain_turn_finds_the_model_card(
    start_server: StartServer, codex_binary: pathlib.Path, tmp_path: pathlib.Path, model: str
) -> None:
    codex = await _codex(start_server, codex_binary, tmp_path, model=model)
    run = await codex.exec("hello there")
    assert run.answer == "You said: hello there"
    assert not [w for w in run.warnings if FALLBACK_WARNING in w]
    assert run.usage["reasoning_output_tokens"] > 0


async def test_the_minimal_configuration_works_on_fallback_metadata(
    start_server: StartServer, codex_binary: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    codex = await _codex(start_server, codex_binary, tmp_path, card=False)
    run = await codex.exec("hello there")
    assert run.answer == "You said: hello there"
    # Without the auth command Codex does not read /v1/models, and says so.
    assert any(FALLBACK_WARNING in w for w in run.warnings)


async def test_the_shell_tool_round_trip(
    start_server: StartServer, codex_binary: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    codex = await _codex(start_server, codex_binary, tmp_path)
    run = await codex.exec('call:exec_command {"cmd": "echo made > made.txt && cat made.txt"}')
    [command] = run.items("command_execution")
    assert command["exit_code"] == 0
    assert (codex.work / "made.txt").read_text() == "made\n"
    assert "made" in run.answer and run.answer.startswith("Tool result: ")


async def test_two_shell_calls_in_one_response(
    start_server: StartServer, codex_binary: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    codex = await _codex(start_server, codex_binary, tmp_path)
    run = await codex.exec(
        'call:exec_command {"cmd": "touch one.txt"} call:exec_command {"cmd": "touch two.txt"}'
    )
    assert len(run.items("command_execution")) == 2
    assert (codex.work / "one.txt").exists() and (codex.work / "two.txt").exists()


async def test_apply_patch_edits_files(
    start_server: StartServer, codex_binary: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    codex = await _codex(start_server, codex_binary, tmp_path)
    (codex.work / "notes.txt").write_text("old line\nkept\n")
    patch = "\n".join(
        [
            "*** Begin Patch",
            "*** Add File: hello.txt",
            "+hello from the patch",
            "*** Update File: notes.txt",
            "@@",
            "-old line",
            "+new line",
            " kept",
            "*** End Patch",
        ]
    )
    run = await codex.exec(f"custom:apply_patch <<<{patch}>>>")
    [change] = run.items("file_change")
    assert sorted(c["kind"] for c in change["changes"]) == ["add", "update"]
    assert (codex.work / "hello.txt").read_text() == "hello from the patch\n"
    assert (codex.work / "notes.txt").read_text() == "new line\nkept\n"
    assert "Success" in run.answer


@pytest.mark.parametrize("card", [False, True], ids=["fallback", "card"])
async def test_view_image_turn_goes_on(
    start_server: StartServer, codex_binary: pathlib.Path, tmp_path: pathlib.Path, card: bool
) -> None:
    codex = await _codex(start_server, codex_binary, tmp_path, card=card)
    (codex.work / "dot.png").write_bytes(PNG)
    run = await codex.exec('call:view_image {"path": "dot.png"}')
    if card:
        # The card says gpt-oss reads text only: Codex declines the image itself.
        assert "image" in run.answer and "not" in run.answer
    else:
        # Codex sends the image; the model reads a placeholder that says so.
        assert run.answer == "Tool result: [image omitted: this model reads text only]"


async def test_resume_sends_the_thread_again(
    start_server: StartServer, codex_binary: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    codex = await _codex(start_server, codex_binary, tmp_path)
    first = await codex.exec('call:exec_command {"cmd": "seq 1 200"}')
    resumed = await codex.exec("and now?", resume=first.thread_id)
    assert resumed.thread_id == first.thread_id
    assert resumed.answer == "You said: and now?"
    fresh = await codex.exec("and now?")
    # The resumed turn's prompt holds the first turn: its call and 200 lines of output.
    assert resumed.usage["input_tokens"] > fresh.usage["input_tokens"] + 200


async def test_auto_compaction(
    start_server: StartServer, codex_binary: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    codex = await _codex(start_server, codex_binary, tmp_path)
    run = await codex.exec(
        'call:exec_command {"cmd": "seq 1 3000"}', "-c", "model_auto_compact_token_limit=4000"
    )
    # Past the limit Codex asked for a summary and went on from it: the last prompt
    # is its hand-over text, not the tool output.
    assert run.items("command_execution")
    assert run.answer.startswith("You said: Another language model started to solve this")


async def test_output_schema(
    start_server: StartServer, codex_binary: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    codex = await _codex(start_server, codex_binary, tmp_path)
    schema = {
        "type": "object",
        "properties": {"answer": {"type": "string"}, "count": {"type": "integer"}},
        "required": ["answer", "count"],
        "additionalProperties": False,
    }
    schema_file = tmp_path / "schema.json"
    schema_file.write_text(json.dumps(schema))
    run = await codex.exec('{"answer": "yes", "count": 3}', "--output-schema", str(schema_file))
    assert json.loads(run.answer) == {"answer": "yes", "count": 3}


async def test_web_search_without_a_provider(
    start_server: StartServer, codex_binary: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    codex = await _codex(start_server, codex_binary, tmp_path)
    run = await codex.exec("search: trio nurseries")
    [search] = run.items("web_search")
    assert search["query"] == "trio nurseries"
    assert run.answer.startswith("Tool result: Web search is not available on this server")


async def test_web_search_with_the_bundled_browser(
    start_server: StartServer,
    codex_binary: pathlib.Path,
    tmp_path: pathlib.Path,
    nursery: trio.Nursery,
) -> None:
    web: WebFakes = await nursery.start(serve_web_fakes)
    codex = await _codex(
        start_server,
        codex_binary,
        tmp_path,
        web_search=f"searxng={web.url}/searxng",
        web_search_allow_hosts=("127.0.0.1",),
    )
    run = await codex.exec("search: trio nurseries")
    [search] = run.items("web_search")
    assert search["query"] == "trio nurseries"
    assert "Nurseries and spawning" in run.answer
    # Codex sends external_web_access: false: the results came, no page was fetched.
    assert web.page_requests == []


async def test_multi_agent_tools_through_tool_search(
    start_server: StartServer, codex_binary: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    codex = await _codex(start_server, codex_binary, tmp_path)
    # With the card Codex defers its multi-agent tools behind tool_search.
    found = await codex.exec('call:tool_search {"query": "spawn a sub agent"}')
    assert "multi_agent_v1.spawn_agent" in found.answer
    spawned = await codex.exec(
        'call:multi_agent_v1.spawn_agent {"message": "say hi"}', resume=found.thread_id
    )
    [spawn] = [c for c in spawned.items("collab_tool_call") if c["tool"] == "spawn_agent"]
    assert spawn["prompt"] == "say hi"
    [agent] = spawn["receiver_thread_ids"]  # a sub-agent thread, run on this server too
    # The parent's answer reads the spawn's result (the sub-agent's own messages may be
    # printed too, in any order).
    said = [str(m["text"]) for m in spawned.items("agent_message")]
    assert any(text.startswith("Tool result: ") and agent in text for text in said), said
