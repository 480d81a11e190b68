"""Claude's memory tool is durable per user, and an offloaded result is readable with it.

End to end over HTTP with the fake Messages server: what a user's conversation writes under
`/memories` is there in that user's next conversation (and not in another user's), on disk at
`{workspace}/agents/{owner}/memories/{user}/`; a long result of another tool is offloaded with a
preview that names the memory tool's `view` (the only file tool the model has on this surface),
and viewing that path returns the whole result.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from fastapi import FastAPI

from atmosphere_harness import HarnessSettings, StreamingSession, agent, prompt, tool
from atmosphere_harness import create_harness_router as router_for
from atmosphere_harness._filesystem.provider import user_dir_name
from atmosphere_harness._runtimes.anthropic import AnthropicRuntime
from tests.fake_providers import Stream, anthropic_text, anthropic_tool_uses, fake_anthropic
from tests.support import client_for, parse_sse, serve

BIG = "".join(f"line {n:05d} of a long listing\n" for n in range(1500))
PATH = "/atmosphere/agent/claude-memo"
ALICE = {"X-User-Id": "alice"}
BOB = {"X-User-Id": "bob@example.com"}


@agent(name="claude-memo")
class ClaudeMemo:
    @tool
    async def listing(self) -> str:
        """Return a long listing."""
        return BIG

    @prompt
    async def chat(self, message: str, session: StreamingSession) -> None:
        await session.stream(message)


def app_for(base: str, workspace: Path, **settings: Any) -> FastAPI:
    runtime = AnthropicRuntime("claude-fake", base_url=base, api_key="sk-ant-test")
    app = FastAPI()
    app.include_router(
        router_for(
            HarnessSettings(workspace_root=workspace, user_id_header="X-User-Id", **settings),
            agents=[ClaudeMemo],
            runtime=runtime,
        )
    )
    return app


async def post_prompt(
    client: Any,
    path: str,
    message: str,
    *,
    conversation_id: str,
    headers: dict[str, str] | None = None,
) -> list[dict[str, Any]]:
    body = {"message": message, "conversationId": conversation_id}
    response = await client.post(path, json=body, headers=headers or {})
    assert response.status_code == 200, response.text
    return parse_sse(response.text)


def memory(call_id: str, **arguments: Any) -> Stream:
    return Stream(anthropic_tool_uses([(call_id, "memory", json.dumps(arguments))]))


def results(frames: list[dict[str, Any]]) -> list[str]:
    return [f["data"]["result"] for f in frames if f["event"] == "tool-result"]


async def test_memories_outlive_the_conversation_and_stay_with_their_user(
    workspace: Path,
) -> None:
    view = {"command": "view", "path": "/memories/prefs.md"}
    fake = fake_anthropic().script(
        memory("tu_1", command="create", path="/memories/prefs.md", file_text="tea, no sugar\n"),
        Stream(anthropic_text("Noted.")),
        memory("tu_2", **view),
        Stream(anthropic_text("You like tea.")),
        memory("tu_3", **view),
        Stream(anthropic_text("I know nothing about you.")),
        memory("tu_4", **view),
        Stream(anthropic_text("Nothing here.")),
    )
    async with serve(fake.app) as base, client_for(app_for(base, workspace)) as client:
        await post_prompt(client, PATH, "remember", headers=ALICE, conversation_id="a-1")
        later = await post_prompt(client, PATH, "recall", headers=ALICE, conversation_id="a-2")
        other = await post_prompt(client, PATH, "recall", headers=BOB, conversation_id="b-1")
        anonymous = await post_prompt(client, PATH, "recall", conversation_id="n-1")

    assert "tea, no sugar" in results(later)[0], "the same user's next conversation sees it"
    assert results(other)[0].startswith("Error: The path /memories/prefs.md does not exist")
    assert results(anonymous)[0].startswith("Error: The path /memories/prefs.md does not exist")
    owner = workspace / "agents" / "claude-memo"
    assert (owner / "memories" / "alice" / "prefs.md").read_text() == "tea, no sugar\n"
    assert not (owner / "files" / "a-1" / "prefs.md").exists(), "not in the conversation"
    assert user_dir_name("bob@example.com").startswith("_"), "a digest names an odd user id"


async def test_an_offloaded_result_names_the_memory_view_and_reads_back_whole(
    workspace: Path,
) -> None:
    listing = Stream(anthropic_tool_uses([("tu_1", "listing", "{}")]))
    fake = fake_anthropic().script(listing)
    async with serve(fake.app) as base, client_for(app_for(base, workspace)) as client:
        # The first turn gets the preview; the script then views the path it names.
        fake.script(Stream(anthropic_text("Saved.")))
        first = await post_prompt(client, PATH, "list", headers=ALICE, conversation_id="c-1")
        [preview] = results(first)
        pointer = r"Full output saved to (/memories/tool-output/listing-[0-9a-f]{8}\.txt)"
        found = re.search(pointer, preview)
        assert found, preview
        assert "use the memory tool's view command on it (view_range pages through it)" in preview
        assert "read_file" not in preview, "the model has no read_file on this surface"
        fake.script(
            memory("tu_2", command="view", path=found.group(1)),
            memory("tu_3", command="view", path=found.group(1), view_range=[1500, -1]),
            Stream(anthropic_text("Read it.")),
        )
        second = await post_prompt(client, PATH, "read it", headers=ALICE, conversation_id="c-1")

    whole, tail = results(second)
    numbered = [line.split("\t", 1)[1] for line in whole.splitlines()[1:]]
    assert numbered == BIG.splitlines(), "the whole result, never offloaded again"
    assert tail.splitlines()[1:] == [f"{1500:>6}\tline 01499 of a long listing"]
    saved = workspace / "agents" / "claude-memo" / "files" / "c-1" / "tool-output"
    assert [p.read_text() for p in saved.iterdir()] == [BIG], "kept with the conversation"
