"""The console's run control and conversation list in a real browser (Debian chromium driven by
Playwright, over loopback): Stop, the sidebar's conversations, paging, opening one, deleting one.

The agent and model are those of the run-control tests: `nap <seconds>` asks for a tool that
sleeps (a run long enough to stop), anything else is echoed.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx2
import pytest

from tests.http.test_console_browser import TOKEN, open_console, screenshot, send
from tests.http.test_console_browser import page as page  # the fixture
from tests.http.test_run_control_http import PATH, Runner, runtime
from tests.support import make_app, serve
from tests.support import prompt as post_prompt

pytestmark = pytest.mark.browser

CONVERSATIONS = "#conversations li[data-conversation-id]"
READY = "document.querySelector('#status').textContent === 'ready'"
"""The console's status once a run ended (its conversation may then be closed)."""


def runner_app(workspace: Path) -> Any:
    return make_app([Runner], runtime=runtime(), workspace=workspace, admin_token=TOKEN)


def run_ids_of(page: Any) -> list[str]:
    """The `X-Run-Id` of every prompt the page streams, as they arrive."""
    seen: list[str] = []

    def on_response(response: Any) -> None:
        if response.request.method == "POST" and response.url.endswith(PATH):
            seen.append(response.headers.get("x-run-id"))

    page.on("response", on_response)
    return seen


async def test_stop_cancels_the_streaming_run_and_frees_the_input(
    page: Any, tmp_path: Path, workspace: Path
) -> None:
    run_ids = run_ids_of(page)
    async with serve(runner_app(workspace)) as base, httpx2.AsyncClient(base_url=base) as client:
        await open_console(page, base)
        assert await page.is_hidden("#stop")
        await send(page, "nap 30")
        await page.wait_for_selector(".card.tool[data-tool=nap] .badge.running")
        await page.wait_for_selector("#stop:visible")
        assert await page.is_disabled("#send")
        assert await page.inner_text("#status") == "streaming"
        await screenshot(page, tmp_path, "stop")

        await page.click("#stop")
        await page.wait_for_selector(".run-end:has-text('Stopped.')")
        [run_id] = run_ids
        run = (await client.get(f"{PATH}/runs/{run_id}")).json()
        assert run["status"] == "cancelled", run
        assert run["error"]["type"] == "RunCancelled"
        assert await page.is_hidden("#stop")
        assert await page.is_enabled("#send")
        assert await page.inner_text("#status") == "ready"

        # Usable again: the next message runs in the same conversation.
        await send(page, "hello")
        await page.wait_for_selector(".bubble.assistant:has-text('echo hello')")
        assert len(run_ids) == 2
        assert (await client.get(f"{PATH}/runs/{run_ids[1]}")).json()["status"] == "completed"


async def test_the_sidebar_lists_conversations_newest_first_pages_and_opens_one(
    page: Any, tmp_path: Path, workspace: Path
) -> None:
    async with serve(runner_app(workspace)) as base, httpx2.AsyncClient(base_url=base) as client:
        for index in range(22):
            await post_prompt(client, PATH, f"topic {index:02d}", f"conv-{index:02d}")
        await open_console(page, base)
        await page.wait_for_selector(CONVERSATIONS)
        items = page.locator(CONVERSATIONS)
        ids = "items => items.map(item => item.dataset.conversationId)"
        assert await items.evaluate_all(ids) == [f"conv-{i:02d}" for i in range(21, 1, -1)]
        titles = await page.locator(f"{CONVERSATIONS} .title").all_inner_texts()
        assert titles[0] == "topic 21"
        assert await page.is_visible("#conversations-more")

        await page.click("#conversations-more")
        await page.wait_for_selector(f"{CONVERSATIONS} >> nth=21")
        assert await items.evaluate_all(ids) == [f"conv-{i:02d}" for i in range(21, -1, -1)]
        assert await page.is_hidden("#conversations-more")

        await page.click(f"{CONVERSATIONS}[data-conversation-id=conv-03] .open")
        await page.wait_for_selector("#history-hint:text-matches('^Earlier turns of')")
        assert await page.inner_text("#chat-conversation") == "conv-03"
        bubbles = await page.locator("#transcript .bubble").all_inner_texts()
        assert bubbles == ["topic 03", "echo topic 03"]
        current = await page.get_attribute(
            f"{CONVERSATIONS}[aria-current=true]", "data-conversation-id"
        )
        assert current == "conv-03"

        # A new conversation joins the list, at the top, with its first prompt.
        await page.click("#new-conversation")
        fresh = await page.input_value("#conversation")
        await send(page, "a brand new topic")
        await page.wait_for_selector(f"{CONVERSATIONS}[data-conversation-id='{fresh}']")
        listed = await items.evaluate_all(ids)
        assert listed == [fresh] + [f"conv-{i:02d}" for i in range(21, -1, -1)]
        assert await page.is_hidden("#conversations-more")
        assert await page.locator(f"{CONVERSATIONS} .title").first.inner_text() == (
            "a brand new topic"
        )
        assert await page.get_attribute(f"{CONVERSATIONS} >> nth=0", "aria-current") == "true"
        await page.wait_for_selector(".run-end")
        await screenshot(page, tmp_path, "conversations")


async def test_delete_asks_first_refuses_while_a_run_is_in_flight_then_removes_it(
    page: Any, tmp_path: Path, workspace: Path
) -> None:
    async with serve(runner_app(workspace)) as base, httpx2.AsyncClient(base_url=base) as client:
        for name in ("keep", "drop"):
            await post_prompt(client, PATH, f"about {name}", f"c-{name}")
        await open_console(page, base)
        drop = f"{CONVERSATIONS}[data-conversation-id=c-drop]"
        await page.wait_for_selector(drop)

        # Cancel in the confirmation leaves it alone.
        await page.click(f"{drop} .delete")
        await page.wait_for_selector("#confirm-delete[open]")
        assert await page.inner_text("#confirm-delete-name") == "about drop"
        await page.click("#confirm-delete-cancel")
        await page.wait_for_selector("#confirm-delete:not([open])", state="attached")
        assert await page.locator(drop).count() == 1
        history = f"{PATH}/conversations/c-drop/messages"
        assert (await client.get(history)).status_code == 200

        # While its run is in flight the server refuses (409): the dialog says so, it stays.
        await page.click(f"{drop} .open")
        await page.wait_for_selector("#history-hint:text-matches('^Earlier turns of')")
        await send(page, "nap 30")
        await page.wait_for_selector(".card.tool[data-tool=nap] .badge.running")
        await page.click(f"{drop} .delete")
        await page.click("#confirm-delete-ok")
        await page.wait_for_selector("#confirm-delete-note:has-text('Not deleted')")
        await screenshot(page, tmp_path, "delete-refused")
        assert await page.is_visible("#confirm-delete")
        await page.click("#confirm-delete-cancel")
        assert await page.locator(drop).count() == 1
        assert (await client.get(history)).status_code == 200

        # Once the run stopped, it goes: from the list, the server, and the chat.
        await page.click("#stop")
        await page.wait_for_selector(".run-end:has-text('Stopped.')")
        await page.click(f"{drop} .delete")
        await page.click("#confirm-delete-ok")
        await page.wait_for_selector(drop, state="detached")
        assert await page.is_hidden("#confirm-delete")
        assert (await client.get(history)).status_code == 404
        listed = (await client.get(f"{PATH}/conversations")).json()["conversations"]
        assert [entry["conversationId"] for entry in listed] == ["c-keep"]
        ids = "items => items.map(item => item.dataset.conversationId)"
        assert await page.locator(CONVERSATIONS).evaluate_all(ids) == ["c-keep"]
        assert await page.inner_text("#chat-conversation") != "c-drop"


async def test_leaving_a_prompted_conversation_or_the_page_closes_it(
    page: Any, workspace: Path
) -> None:
    """`POST P/conversations/{id}/close` (long-term memory extracts the conversation's facts
    then) reaches the server when the chat leaves a conversation it prompted in, and when the
    page goes; a conversation only looked at is not closed."""
    closed: list[str] = []
    app = runner_app(workspace)

    async def count_closes(request: Any, call_next: Any) -> Any:
        if request.method == "POST" and request.url.path.endswith("/close"):
            closed.append(request.url.path)
        return await call_next(request)

    app.middleware("http")(count_closes)

    def close_of(conversation: str) -> str:
        return f"{PATH}/conversations/{conversation}/close"

    async def until_closed(conversation: str) -> None:
        deadline = time.monotonic() + 15
        while close_of(conversation) not in closed:
            assert time.monotonic() < deadline, f"{conversation} was never closed: {closed}"
            await asyncio.sleep(0.05)

    async with serve(app) as base, httpx2.AsyncClient(base_url=base) as client:
        await post_prompt(client, PATH, "from elsewhere", "c-looked-at")
        await open_console(page, base)
        first = await page.input_value("#conversation")
        await send(page, "hello")
        await page.wait_for_selector(".bubble.assistant:has-text('echo hello')")
        await page.wait_for_function(READY)

        # Leaving it for a new conversation closes it.
        await page.click("#new-conversation")
        await until_closed(first)

        # Looking at a conversation and leaving it closes nothing.
        await page.wait_for_selector(f"{CONVERSATIONS}[data-conversation-id=c-looked-at]")
        await page.click(f"{CONVERSATIONS}[data-conversation-id=c-looked-at] .open")
        await page.wait_for_selector("#history-hint:text-matches('^Earlier turns of')")
        await page.click("#new-conversation")
        second = await page.input_value("#conversation")
        await send(page, "again")
        await page.wait_for_selector(".bubble.assistant:has-text('echo again')")
        await page.wait_for_function(READY)

        # Closing the page closes the conversation it prompted in last.
        await page.close(run_before_unload=True)
        await until_closed(second)
        assert sorted(closed) == sorted([close_of(first), close_of(second)]), closed
