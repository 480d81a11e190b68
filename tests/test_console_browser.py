"""The console in a real browser: Debian chromium driven by Playwright, over loopback.

`executable_path=/usr/bin/chromium` (never `playwright install`); the background-networking
flags keep Chromium from dialling out, which this machine's closed network refuses. Without
chromium or Playwright the tests skip on a laptop and fail in CI.

Screenshots go to the test's temporary directory; with `UPDATE_SCREENSHOTS=1` they
also replace the images of `docs/console.md` (`docs/images/console-*.png`).
"""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI

from atmosphere_harness import (
    HarnessSettings,
    ScriptedRuntime,
    StreamingSession,
    ToolCall,
    ToolContext,
    agent,
    create_harness_router,
    prompt,
    tool,
)
from tests.support import require_service, serve

pytestmark = pytest.mark.browser

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
TOKEN = "browser-test-token"
DOCS_IMAGES = Path(__file__).resolve().parent.parent / "docs" / "images"
DEMO_PROMPT = "plan a short task and save the result to a file"

# Records every state the live plan shows, so the test sees it tick (not only its end).
WATCH_PLAN = """
window.__planStates = [];
new MutationObserver(() => {
  const steps = [...document.querySelectorAll('#plan-live .step')].map((s) => s.dataset.status);
  if (steps.length) window.__planStates.push(steps.join(','));
}).observe(document.querySelector('#plan-live'), { childList: true, subtree: true });
"""


@pytest.fixture
async def page(tmp_path: Path) -> AsyncIterator[Any]:
    if not Path(CHROMIUM).is_file():
        require_service("chromium", f"{CHROMIUM} is not installed (apt-get install chromium)")
    try:
        from playwright.async_api import async_playwright
    except ImportError:
        require_service("playwright", "the playwright package is not installed")
    async with async_playwright() as playwright:
        context = await playwright.chromium.launch_persistent_context(
            str(tmp_path / "chromium-profile"),
            executable_path=CHROMIUM,
            headless=True,
            args=CHROMIUM_ARGS,
            viewport={"width": 1280, "height": 820},
        )
        try:
            page = context.pages[0] if context.pages else await context.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda error: errors.append(str(error)))
            page.set_default_timeout(15_000)
            yield page
            assert errors == [], errors
        finally:
            await context.close()


async def screenshot(page: Any, tmp_path: Path, name: str) -> None:
    target = tmp_path / f"console-{name}.png"
    await page.screenshot(path=str(target))
    assert target.stat().st_size > 10_000
    if os.environ.get("UPDATE_SCREENSHOTS") == "1":
        DOCS_IMAGES.mkdir(exist_ok=True)
        shutil.copyfile(target, DOCS_IMAGES / target.name)


async def open_console(page: Any, base: str, token: str | None = TOKEN) -> None:
    fragment = f"#token={token}" if token else ""
    await page.goto(f"{base}/atmosphere/console/{fragment}")
    await page.wait_for_selector("body[data-ready=true]")


async def send(page: Any, text: str) -> None:
    await page.fill("#message", text)
    await page.click("#send")


async def test_the_demo_agent_plans_saves_a_file_and_the_workspace_shows_it(
    page: Any, tmp_path: Path, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ATMOSPHERE_WORKSPACE_ROOT", str(workspace))
    monkeypatch.setenv("ATMOSPHERE_ADMIN_TOKEN", TOKEN)
    monkeypatch.setenv("LLM_RUNTIME", "scripted")
    from samples.personal_assistant.app import create_app

    async with serve(create_app()) as base:
        await open_console(page, base)
        assert "token" not in page.url, "the token leaves the address bar"
        stored = await page.evaluate("sessionStorage.getItem('atmosphere-admin-token')")
        assert stored == TOKEN
        await page.evaluate(WATCH_PLAN)

        await send(page, DEMO_PROMPT)
        await page.wait_for_selector(".run-end")
        tools = await page.eval_on_selector_all(
            ".card.tool", "cards => cards.map(c => c.dataset.tool)"
        )
        assert tools == ["write_todos", "write_file", "write_todos"]
        answer = await page.inner_text(".bubble.assistant")
        assert answer.startswith("Done: I planned the task in three steps")
        assert await page.inner_text("#status") == "connected"
        await screenshot(page, tmp_path, "chat")

        await page.click("[data-tab=workspace]")
        states = await page.evaluate("window.__planStates")
        assert "in_progress,pending,pending" in states, states
        assert states[-1] == "completed,completed,completed"
        live = await page.eval_on_selector_all(
            "#plan-live .step",
            "steps => steps.map(s => [s.dataset.status, s.querySelector('.content').textContent])",
        )
        assert live == [
            ["completed", "Outline the task"],
            ["completed", "Write the result to a file"],
            ["completed", "Review the result"],
        ]
        await page.wait_for_selector("#plan-stored .step")
        stored_plan = await page.eval_on_selector_all(
            "#plan-stored .step", "steps => steps.map(s => s.dataset.status)"
        )
        assert stored_plan == ["completed"] * 3

        await page.click("#files button[data-path='notes']")
        await page.click("#files button[data-path='notes/task.md']")
        await page.wait_for_selector("#viewer[data-path='notes/task.md']")
        content = await page.inner_text("#viewer")
        assert content.startswith(f"# {DEMO_PROMPT}")
        assert "every step of the plan is complete" in content
        conversation = await page.input_value("#conversation")
        # The sample's owner and category (agent or coordinator) are the sample's business.
        [saved] = workspace.glob(f"*/*/files/{conversation}/notes/task.md")
        assert await page.text_content("#viewer") == saved.read_text()
        await screenshot(page, tmp_path, "workspace")

        await page.click("[data-tab=harness]")
        harness = await page.inner_text("#harness")
        assert "planning" in harness
        assert "ACTIVE(builtin)" in harness
        assert await page.input_value("#endpoint") in harness
        await screenshot(page, tmp_path, "harness")


# --- tool cards, offload, approvals and sub-agents ----------------------------------------------

APPROVALS: dict[str, asyncio.Future[bool]] = {}


@tool
async def long_report(context: ToolContext) -> str:
    """Produce a long report (longer than the offload threshold)."""
    return "".join(f"line {index}: all systems nominal\n" for index in range(400))


@tool
async def send_email(to: str, context: ToolContext) -> str:
    """Send an email once a person approves it."""
    approval = asyncio.get_running_loop().create_future()
    APPROVALS["ap-1"] = approval
    await context.run.session.emit(
        "approval-required",
        {
            "approvalId": "ap-1",
            "toolCallId": context.call.id,
            "tool": "send_email",
            "arguments": {"to": to},
            "expiresAt": "2030-01-01T00:00:00Z",
        },
    )
    return f"sent to {to}" if await approval else "the user denied it"


@tool
async def research(topic: str, context: ToolContext) -> str:
    """Run a sub-agent on a topic."""
    session = context.run.session
    await session.emit(
        "subagent-start", {"subagentId": "sub-1", "agentId": "researcher", "description": topic}
    )
    for status in ("in_progress", "completed"):
        await session.emit(
            "plan-update",
            {
                "steps": [{"content": f"Read about {topic}", "status": status}],
                "goal": None,
                "conversationId": context.conversation_id,
                "agentId": "researcher",
                "subagentId": "sub-1",
            },
        )
    report = f"{topic}: three sources agree."
    await session.emit(
        "subagent-end", {"subagentId": "sub-1", "status": "completed", "report": report}
    )
    return report


@agent(name="clerk")
class Clerk:
    tools = [long_report, send_email, research]

    @prompt
    async def chat(self, message: str, session: StreamingSession) -> None:
        await session.stream(message)


def clerk_app(workspace: Path) -> FastAPI:
    runtime = ScriptedRuntime(
        [
            [ToolCall("long_report", {})],
            [ToolCall("research", {"topic": "tides"})],
            [ToolCall("send_email", {"to": "ops@example.com"})],
            "All three tasks are finished.",
        ]
    )
    app = FastAPI()
    app.include_router(
        create_harness_router(
            HarnessSettings(workspace_root=workspace, admin_token=TOKEN),
            agents=[Clerk],
            runtime=runtime,
        )
    )

    # A stand-in for the governance primitive's route, with the same contract.
    @app.post("/atmosphere/agent/clerk/approvals/{approval_id}")
    async def answer(approval_id: str, body: dict[str, Any]) -> dict[str, Any]:
        approval = APPROVALS.pop(approval_id)
        approval.set_result(bool(body["approve"]))
        return {"approvalId": approval_id, "approved": bool(body["approve"])}

    return app


async def test_tool_cards_offload_links_approvals_and_subagents(
    page: Any, tmp_path: Path, workspace: Path
) -> None:
    async with serve(clerk_app(workspace)) as base:
        await open_console(page, base)
        await send(page, "report, research and email")

        approve = await page.wait_for_selector(".card.approval button.approve")
        card_text = await page.inner_text(".card.approval")
        assert "send_email" in card_text
        assert "ops@example.com" in card_text
        await approve.click()
        await page.wait_for_selector(".run-end")
        assert await page.inner_text(".card.approval .badge") == "approved"
        email = await page.inner_text(".card.tool[data-tool=send_email] .result")
        assert email == "sent to ops@example.com"

        subagent = await page.inner_text(".card.subagent")
        assert "researcher" in subagent
        assert "tides: three sources agree." in subagent
        assert await page.inner_text(".card.subagent .badge") == "completed"
        assert await page.get_attribute(".card.subagent .step", "data-status") == "completed"

        result = await page.inner_text(".card.tool[data-tool=long_report] .result")
        assert result.startswith("line 0: all systems nominal")
        assert "chars truncated" in result
        link = page.locator(".card.tool[data-tool=long_report] .offload button")
        pointer = await link.inner_text()
        assert pointer.startswith("tool-output/long_report-")
        await screenshot(page, tmp_path, "cards")
        await link.click()
        await page.wait_for_selector(f"#viewer[data-path='{pointer}']")
        offloaded = await page.inner_text("#viewer")
        assert offloaded.startswith("line 0: all systems nominal")
        assert "line 399: all systems nominal" in offloaded, "the full output, not the preview"


async def test_without_a_token_the_workspace_says_how_to_get_one(
    page: Any, workspace: Path
) -> None:
    async with serve(clerk_app(workspace)) as base:
        await open_console(page, base, token=None)
        await page.click("[data-tab=workspace]")
        notice = await page.inner_text("#workspace-notice")
        assert "#token=" in notice
        assert await page.inner_text("#endpoint option") == "clerk · /atmosphere/agent/clerk"
