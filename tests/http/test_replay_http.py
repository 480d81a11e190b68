"""A reader that re-attaches with `Last-Event-ID` gets every frame it missed, wherever that id
lands in a long answer: the journal keeps a run's consecutive text frames joined
(`kernel.live.SPAN_FRAMES` at a time), and each comes back as it was first streamed."""

from __future__ import annotations

from pathlib import Path

from atmosphere_harness import ScriptedRuntime, StreamingSession, ToolCall, agent, prompt, tool
from atmosphere_harness._kernel.live import SPAN_FRAMES
from tests.support import client_for, make_app, of_type, parse_sse
from tests.support import prompt as post_prompt

PATH = "/atmosphere/agent/talker"
WORDS = " ".join(f"w{n}{'é' * (n % 3)}" for n in range(4 * SPAN_FRAMES + 9))


@agent(name="talker")
class Talker:
    @prompt
    async def chat(self, message: str, session: StreamingSession) -> None:
        await session.stream(message)

    @tool
    async def look(self) -> str:
        """Look around."""
        return "nothing new"


async def test_last_event_id_anywhere_in_a_long_answer_replays_every_frame_after_it(
    tmp_path: Path,
) -> None:
    # Two long answers around a tool call: text frames, then tool frames, then text again.
    runtime = ScriptedRuntime([WORDS, [ToolCall("look", {}, "call-1")], WORDS])
    app = make_app([Talker], runtime=runtime, workspace=tmp_path)
    async with client_for(app) as client:
        first = await post_prompt(client, PATH, "talk", conversation_id="long")
        second = await post_prompt(client, PATH, "look, then talk", conversation_id="long")
        texts = of_type(second, "text")
        assert len(texts) > 4 * SPAN_FRAMES
        assert "".join(f["data"]["text"] for f in of_type(first, "text")) == WORDS
        seqs = [f["seq"] for f in second]
        assert seqs == list(range(1, len(second) + 1))
        landings = {0, 1, SPAN_FRAMES - 1, SPAN_FRAMES, SPAN_FRAMES + 1, 2 * SPAN_FRAMES + 5}
        landings |= {len(second) - 2, len(second) - 1, len(second)}
        landings |= {f["seq"] for f in second if f["event"] != "text"}
        for after in sorted(landings):
            response = await client.get(
                f"{PATH}/conversations/long/events", headers={"Last-Event-ID": str(after)}
            )
            assert response.status_code == 200
            assert parse_sse(response.text) == second[after:], after
