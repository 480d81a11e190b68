"""The console in a real browser: Debian chromium driven by Playwright, over loopback.

`executable_path=/usr/bin/chromium` (never `playwright install`); the background-networking
flags keep Chromium from dialling out, which this machine's closed network refuses. Without
chromium or Playwright the tests skip on a laptop and fail in CI.

Screenshots go to the test's temporary directory; with `UPDATE_SCREENSHOTS=1` those that
`docs/console.md` shows also replace its images (`docs/images/console-*.png`).
"""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI

from atmosphere_harness import (
    Admit,
    Deny,
    HarnessSettings,
    ModelRequest,
    ScriptedRuntime,
    ToolCall,
    ToolContext,
    agent,
    coordinator,
    create_harness_router,
    tool,
)
from atmosphere_harness._delegation import SYSTEM_PROMPT as SUBAGENT_PROMPT
from tests.agents import echo
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
DOCS_IMAGES = Path(__file__).resolve().parents[2] / "docs" / "images"
DOCS_SHOTS = {"chat", "cards", "workspace", "harness"}
"""The screenshots `docs/console.md` shows; the others stay in the test's directory."""
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
    if os.environ.get("UPDATE_SCREENSHOTS") == "1" and name in DOCS_SHOTS:
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
        assert await page.inner_text("#status") == "ready"
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


@tool
async def long_report(context: ToolContext) -> str:
    """Produce a long report (longer than the offload threshold)."""
    return "".join(f"line {index}: all systems nominal\n" for index in range(400))


@tool(requires_approval=True)
async def send_email(to: str) -> str:
    """Send an email once a person approves it."""
    return f"sent to {to}"


Clerk = echo(coordinator("clerk", fleet=()), "Clerk", tools=[long_report, send_email])


def clerk_turn(request: ModelRequest) -> Any:
    """The clerk offloads a report, spawns a real `task` sub-agent, then asks to send an email;
    the sub-agent plans one step, ticks it and reports."""
    last_user = max(i for i, m in enumerate(request.messages) if m.role == "user")
    rounds = sum(1 for m in request.messages[last_user:] if m.role == "assistant")
    if request.system_prompt == SUBAGENT_PROMPT:
        if rounds < 2:
            status = "in_progress" if rounds == 0 else "completed"
            return [
                ToolCall(
                    "write_todos", {"todos": [{"content": "Read about tides", "status": status}]}
                )
            ]
        return "tides: three sources agree."
    script: list[Any] = [
        [ToolCall("long_report", {})],
        [ToolCall("task", {"description": "research tides"})],
        [ToolCall("send_email", {"to": "ops@example.com"})],
        "All three tasks are finished.",
    ]
    return script[min(rounds, len(script) - 1)]


def clerk_app(workspace: Path) -> FastAPI:
    app = FastAPI()
    app.include_router(
        create_harness_router(
            HarnessSettings(workspace_root=workspace, admin_token=TOKEN),
            agents=[Clerk],
            runtime=ScriptedRuntime((), default=clerk_turn),
        )
    )
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
        assert "research tides" in subagent
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


@tool
async def drop_table(name: str) -> str:
    """Drop a database table.

    Args:
        name: The table.
    """
    return f"dropped {name}"


class NoDrops:
    name = "no-drops"

    def evaluate(self, ctx: Any) -> Any:
        if ctx.request.metadata.get("tool_name") == "drop_table":
            return Deny("tables are forever")
        return Admit()


Dba = echo(agent(name="dba", harness=()), "Dba", tools=[drop_table])


def dba_turn(request: ModelRequest) -> Any:
    if request.messages[-1].role == "user":
        return [ToolCall("drop_table", {"name": "users"})]
    return "I was not allowed to."


async def test_a_call_governance_denied_reads_as_denied(page: Any, workspace: Path) -> None:
    app = FastAPI()
    app.include_router(
        create_harness_router(
            HarnessSettings(workspace_root=workspace, admin_token=TOKEN),
            agents=[Dba],
            runtime=ScriptedRuntime((), default=dba_turn),
            policies=[NoDrops()],
        )
    )
    async with serve(app) as base:
        await open_console(page, base)
        await send(page, "drop the users table")
        await page.wait_for_selector(".run-end")
        card = ".card.tool[data-tool=drop_table]"
        assert await page.inner_text(f"{card} .badge") == "denied"
        assert await page.get_attribute(card, "data-outcome") == "denied"
        result = await page.inner_text(f"{card} .result")
        assert "Tool drop_table denied by policy 'no-drops': tables are forever" in result


async def test_without_a_token_the_workspace_says_how_to_get_one(
    page: Any, workspace: Path
) -> None:
    async with serve(clerk_app(workspace)) as base:
        await open_console(page, base, token=None)
        await page.click("[data-tab=workspace]")
        notice = await page.inner_text("#workspace-notice")
        assert "#token=" in notice
        assert await page.inner_text("#endpoint option") == "clerk · /atmosphere/agent/clerk"


# --- a newcomer's first app, and the console at a laptop's width -------------------------------

GETTING_STARTED = Path(__file__).resolve().parents[2] / "docs" / "getting-started.md"
HEADER_BOXES = """
() => Object.fromEntries(
  [["bar", ".bar"], ["title", ".bar h1"], ["pill", "#status"], ["button", "#new-conversation"]]
    .map(([name, selector]) => {
      const box = document.querySelector(selector).getBoundingClientRect();
      return [name, { top: box.top, bottom: box.bottom, right: box.right }];
    }),
)
"""


async def test_the_getting_started_tool_shows_as_a_card_on_the_demo_model(
    page: Any, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.support import doc_example

    monkeypatch.setenv("ATMOSPHERE_WORKSPACE_ROOT", str(workspace))
    app = doc_example(GETTING_STARTED, "getting_started_console").app
    async with serve(app) as base:
        await open_console(page, base, token=None)
        await send(page, "what is the weather in Paris?")
        await page.wait_for_selector(".run-end")
        card = ".card.tool[data-tool=weather]"
        assert await page.inner_text(f"{card} .badge") == "done"
        assert await page.inner_text(f"{card} .result") == "Sunny in Paris"
        await page.click(f"{card} details summary")
        assert '"city": "Paris"' in await page.inner_text(f"{card} details")
        answer = await page.inner_text(".bubble.assistant")
        assert answer == "The weather tool says: Sunny in Paris"


async def _header_on_one_line(page: Any) -> None:
    boxes = await page.evaluate(HEADER_BOXES)
    bar, title, pill = boxes["bar"], boxes["title"], boxes["pill"]
    assert pill["top"] < title["bottom"], f"the pill wrapped below the title: {boxes}"
    assert pill["bottom"] > title["top"], boxes
    assert bar["bottom"] - bar["top"] < 2.5 * (title["bottom"] - title["top"]), boxes
    assert pill["right"] <= 1280, boxes


async def test_at_1280_the_header_keeps_one_line_and_suggestions_stay(
    page: Any, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ATMOSPHERE_WORKSPACE_ROOT", str(workspace))
    monkeypatch.setenv("ATMOSPHERE_ADMIN_TOKEN", TOKEN)
    monkeypatch.setenv("LLM_RUNTIME", "scripted")
    from samples.personal_assistant.app import create_app

    await page.set_viewport_size({"width": 1280, "height": 800})
    async with serve(create_app()) as base:
        await open_console(page, base)
        await _header_on_one_line(page)  # "ready"
        chips = "#suggestion-list button"
        assert await page.is_visible(chips), "a new conversation shows its suggestions"
        offered = await page.eval_on_selector_all(chips, "bs => bs.map(b => b.textContent)")
        assert DEMO_PROMPT in offered

        await page.click(f"{chips} >> text=hello")
        await page.wait_for_selector(".run-end")
        assert await page.inner_text(".bubble.assistant") == "You said: hello"
        await _header_on_one_line(page)  # "connected"
        await page.evaluate(
            "document.querySelector('#status').textContent = 'connected · heartbeat 12:34:56 PM'"
        )
        await _header_on_one_line(page)  # the longest text the pill shows

        # After the answer the suggestions are still there, folded under the input.
        assert await page.eval_on_selector("#suggestions", "d => !d.hidden && !d.open")
        assert await page.eval_on_selector_all(chips, "bs => bs.length") == len(offered)
        await page.click("#suggestions summary")
        await page.click(f"{chips} >> text={DEMO_PROMPT}")
        await page.locator(".run-end").nth(1).wait_for()
        tools = await page.eval_on_selector_all(
            ".card.tool", "cards => cards.map(c => c.dataset.tool)"
        )
        assert tools == ["write_todos", "write_file", "write_todos"]


# --- the console tells the truth: connection, conversation, files, runtime facts ----------------


async def test_the_badge_reads_ready_before_the_first_message(
    page: Any, tmp_path: Path, workspace: Path
) -> None:
    async with serve(clerk_app(workspace)) as base:
        await open_console(page, base)
        assert await page.inner_text("#status") == "ready"
        assert await page.get_attribute("#status", "data-state") == "ready"
        await screenshot(page, tmp_path, "ready")


async def test_the_file_viewer_says_why_it_is_empty(
    page: Any, tmp_path: Path, workspace: Path
) -> None:
    async with serve(clerk_app(workspace)) as base:
        await open_console(page, base)
        await page.click("[data-tab=workspace]")
        await page.wait_for_selector("#files .empty >> text=No files in this conversation yet.")
        assert await page.inner_text("#viewer") == "This conversation has no files yet."
        await screenshot(page, tmp_path, "viewer-no-files")

        await page.click("[data-tab=chat]")
        await send(page, "report, research and email")
        await (await page.wait_for_selector(".card.approval button.approve")).click()
        await page.wait_for_selector(".run-end")
        await page.click("[data-tab=workspace]")
        await page.wait_for_selector("#files button[data-path='tool-output']")
        assert await page.inner_text("#viewer") == "No file selected: pick one under Files."


@tool
async def find_book(title: str) -> str:
    """Find a book on the shelves.

    Args:
        title: The book's title.
    """
    return f"{title}: shelf 7"


Librarian = echo(agent(name="librarian"), "Librarian", tools=[find_book])


def librarian_turn(request: ModelRequest) -> Any:
    last = request.messages[-1]
    if last.role == "user":
        return [ToolCall("find_book", {"title": last.content.removeprefix("where is ")})]
    return f"It is on {last.content.partition(': ')[2]}."


async def test_switching_the_conversation_box_moves_the_chat_and_shows_its_earlier_turns(
    page: Any, tmp_path: Path, workspace: Path
) -> None:
    app = FastAPI()
    app.include_router(
        create_harness_router(
            HarnessSettings(workspace_root=workspace, admin_token=TOKEN),
            agents=[Librarian],
            runtime=ScriptedRuntime((), default=librarian_turn),
        )
    )
    async with serve(app) as base:
        await open_console(page, base)
        first = await page.input_value("#conversation")
        assert await page.inner_text("#chat-conversation") == first
        await send(page, "where is dune")
        await page.wait_for_selector(".run-end")
        await page.click("#new-conversation")
        second = await page.input_value("#conversation")
        assert second != first
        assert await page.inner_text("#chat-conversation") == second

        await page.fill("#conversation", first)
        await page.press("#conversation", "Enter")
        await page.wait_for_selector("#history-hint:text-matches('^Earlier turns of')")
        assert await page.inner_text("#chat-conversation") == first
        assert first in await page.inner_text("#history-hint")
        bubbles = page.locator("#transcript .bubble")
        assert await bubbles.all_inner_texts() == ["where is dune", "It is on shelf 7."]
        assert (
            await page.get_attribute("#transcript .bubble:first-of-type", "class") == "bubble user"
        )
        card = page.locator(".card.tool[data-tool=find_book]")
        assert await card.locator(".result").inner_text() == "dune: shelf 7"
        assert await card.get_attribute("data-outcome") == "done"
        assert '"title": "dune"' in (await card.locator(".arguments pre").text_content() or "")
        await screenshot(page, tmp_path, "switched")

        # The next message continues it, after the turns shown.
        await send(page, "where is emma")
        await page.wait_for_selector("#transcript .bubble:has-text('It is on shelf 7.') >> nth=1")
        assert await bubbles.count() == 4

        await page.fill("#conversation", "never-used")
        await page.press("#conversation", "Enter")
        await page.wait_for_selector("#history-hint:has-text('Nothing said yet')")
        assert await page.locator("#transcript .card, #transcript .bubble").count() == 0


SUBAGENT_REPORT = "# Tides\n\nThree sources agree on two tides a day.\n"


def writing_clerk_turn(request: ModelRequest) -> Any:
    """The clerk spawns a `task` sub-agent that saves `report.md` in its own workspace."""
    last_user = max(i for i, m in enumerate(request.messages) if m.role == "user")
    rounds = sum(1 for m in request.messages[last_user:] if m.role == "assistant")
    if request.system_prompt == SUBAGENT_PROMPT:
        if rounds == 0:
            return [ToolCall("write_file", {"path": "report.md", "content": SUBAGENT_REPORT})]
        return "Saved report.md."
    return [ToolCall("task", {"description": "research tides"})] if rounds == 0 else "Done."


def clerk_with(turn: Callable[[ModelRequest], Any], workspace: Path) -> FastAPI:
    app = FastAPI()
    app.include_router(
        create_harness_router(
            HarnessSettings(workspace_root=workspace, admin_token=TOKEN),
            agents=[Clerk],
            runtime=ScriptedRuntime((), default=turn),
        )
    )
    return app


async def test_a_subagents_files_are_browsable_after_it_ends(
    page: Any, tmp_path: Path, workspace: Path
) -> None:
    async with serve(clerk_with(writing_clerk_turn, workspace)) as base:
        await open_console(page, base)
        await send(page, "research tides")
        await page.wait_for_selector(".run-end")
        link = page.locator(".card.subagent .offload button")
        folder = await link.get_attribute("data-path")
        assert folder is not None
        assert folder.startswith("subagents/subagent-")
        await screenshot(page, tmp_path, "subagent-files")
        await link.click()
        report = f"#files button[data-path='{folder}/report.md']"
        await page.click(report)
        await page.wait_for_selector(f"#viewer[data-path='{folder}/report.md']")
        assert await page.text_content("#viewer") == SUBAGENT_REPORT
        await screenshot(page, tmp_path, "subagent-report")


def nesting_clerk_turn(request: ModelRequest) -> Any:
    """The clerk spawns `outer`, which spawns `inner`, which saves `report.md`."""
    if request.system_prompt == SUBAGENT_PROMPT and request.messages[0].content == "outer":
        last_user = max(i for i, m in enumerate(request.messages) if m.role == "user")
        done = any(m.role == "assistant" for m in request.messages[last_user:])
        return "outer done" if done else [ToolCall("task", {"description": "inner"})]
    if request.system_prompt != SUBAGENT_PROMPT:
        last_user = max(i for i, m in enumerate(request.messages) if m.role == "user")
        if not any(m.role == "assistant" for m in request.messages[last_user:]):
            return [ToolCall("task", {"description": "outer"})]
        return "Done."
    return writing_clerk_turn(request)


async def test_a_nested_subagents_link_opens_the_folder_inside_its_parents(
    page: Any, workspace: Path
) -> None:
    async with serve(clerk_with(nesting_clerk_turn, workspace)) as base:
        await open_console(page, base)
        await send(page, "research tides")
        await page.wait_for_selector(".run-end")
        ids = await page.eval_on_selector_all(
            ".card.subagent strong", "names => names.map(n => n.textContent)"
        )
        outer, inner = ids
        folders = await page.eval_on_selector_all(
            ".card.subagent .offload button", "links => links.map(l => l.dataset.path)"
        )
        assert folders == [f"subagents/{outer}", f"subagents/{outer}/subagents/{inner}"]
        await page.locator(".card.subagent .offload button").nth(1).click()
        await page.click(f"#files button[data-path='{folders[1]}/report.md']")
        await page.wait_for_selector(f"#viewer[data-path='{folders[1]}/report.md']")
        assert await page.text_content("#viewer") == SUBAGENT_REPORT


async def test_the_harness_tab_shows_backends_mcp_skills_and_any_other_fact(
    page: Any, tmp_path: Path, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from atmosphere_harness._web import console_info as module
    from tests.mcp.support import http_server
    from tests.skills.support import write_skill

    reported = module.console_info

    def with_later_facts(host: Any) -> dict[str, Any]:
        # Facts the console does not know by name yet: they show without a console change.
        info = reported(host)
        info["tracing"] = "ACTIVE(otel)"
        for endpoint in info["endpoints"]:
            endpoint["harness"]["model"] = ["openai:gpt-4o", "anthropic:claude-sonnet-4"]
            endpoint["limits"] = {"request_limit": "3"}
        return info

    monkeypatch.setattr(module, "console_info", with_later_facts)
    skills = tmp_path / "skills"
    write_skill(skills, "tides", "Explains tides")
    async with http_server() as server:
        Tidal = echo(agent("tidal", mcp_servers=[server], skills=[skills]), "Tidal")
        app = FastAPI()
        app.include_router(
            create_harness_router(
                HarnessSettings(workspace_root=workspace, admin_token=TOKEN, durable_runs=True),
                agents=[Tidal],
            )
        )
        async with serve(app) as base:
            await open_console(page, base)
            await page.click("[data-tab=harness]")
            harness = await page.inner_text("#harness")
            assert "Backends" in harness
            assert "state\tsqlite" in harness, harness
            assert "events\tlocal" in harness
            assert "durable-runs" in harness
            assert "tracing\tACTIVE(otel)" in harness
            panel = "#harness .endpoint[data-path='/atmosphere/agent/tidal']"
            chain = await page.eval_on_selector_all(
                f"{panel} .values li", "items => items.map(i => i.textContent)"
            )
            assert chain == ["openai:gpt-4o", "anthropic:claude-sonnet-4"]
            endpoint = await page.inner_text(panel)
            assert "request_limit" in endpoint
            assert "MCP servers: " in endpoint
            assert "tides — Explains tides" in endpoint
            await screenshot(page, tmp_path, "harness-truth")
            await page.locator(f"{panel} .mcp-servers").scroll_into_view_if_needed()
            await screenshot(page, tmp_path, "harness-endpoint")


@tool
async def slow_lookup(context: ToolContext) -> str:
    """Look something up slowly."""
    await asyncio.sleep(1.5)
    return "found it"


Slow = echo(agent(name="slow", harness=()), "Slow", tools=[slow_lookup])


def slow_turn(request: ModelRequest) -> Any:
    return [ToolCall("slow_lookup", {})] if request.messages[-1].role == "user" else "It is found."


async def test_a_run_of_the_conversation_left_behind_is_not_drawn_into_the_next(
    page: Any, workspace: Path
) -> None:
    app = FastAPI()
    app.include_router(
        create_harness_router(
            HarnessSettings(workspace_root=workspace, admin_token=TOKEN),
            agents=[Slow],
            runtime=ScriptedRuntime((), default=slow_turn),
        )
    )
    async with serve(app) as base:
        await open_console(page, base)
        await send(page, "look it up")
        await page.wait_for_selector(".card.tool[data-tool=slow_lookup] .badge.running")
        await page.fill("#conversation", "another-conversation")
        await page.press("#conversation", "Enter")
        await page.wait_for_selector("#history-hint")
        await page.wait_for_selector("#send:not([disabled])", timeout=10_000)
        assert await page.locator("#transcript .card, #transcript .bubble").count() == 0
        assert await page.inner_text("#chat-conversation") == "another-conversation"
