"""The personal assistant: a complete deep agent and its fleet, in a few lines.

- `assistant` (a `@coordinator`, the full harness): plans, keeps notes in its workspace,
  remembers you, delegates to its fleet with `delegate_task` and spawns isolated sub-agents with
  `task`;
- `writer` (a prompt agent in the fleet): drafts text in its own harnessed loop;
- `research` (a headless agent in the fleet): answers from a small offline notebook through its
  `@skill` handler (swap in a search API);
- `/atmosphere/ai-chat` (an `ai_endpoint` opted in with `harness=(Harness.ALL,)`): the same
  harness on a plain endpoint.

Run it with `make demo` (or `python -m samples.personal_assistant`); with no model configured the
built-in scripted demo runtime answers, so it works offline. Try:

- "plan a short task and save the result to a file"
- "Use the task tool to spawn a general-purpose subagent to brainstorm three team-building
  activities, then give me its report."
- "ask the research agent about otters"
"""

from __future__ import annotations

from fastapi import FastAPI

from atmosphere_harness import (
    Harness,
    HarnessSettings,
    StreamingSession,
    agent,
    ai_endpoint,
    coordinator,
    create_harness_router,
    prompt,
    skill,
)

NOTEBOOK = {
    "otters": "Sea otters hold hands while they sleep so they do not drift apart.",
    "team-building": "Short, optional, inclusive activities work best: a shared lunch, a "
    "puzzle hunt, a volunteering afternoon.",
    "atmosphere": "atmosphere-harness hosts deep agents in any FastAPI app.",
}


@agent(name="research", headless=True)
class Research:
    """Looks facts up in the team's notebook."""

    @skill("default")
    async def lookup(self, message: str) -> str:
        found = [fact for topic, fact in NOTEBOOK.items() if topic in message.lower()]
        return " ".join(found) or f"The notebook has nothing on {message!r} yet."


@agent(
    name="writer",
    system_prompt="You are a concise writer. Draft exactly what you are asked for, nothing more.",
)
class Writer:
    """Drafts and polishes short texts."""

    @prompt
    async def chat(self, message: str, session: StreamingSession) -> None:
        await session.stream(message)


@coordinator("assistant", fleet=[Research, Writer])
class Assistant:
    """A personal assistant that plans, keeps notes, remembers you and delegates."""

    @prompt
    async def chat(self, message: str, session: StreamingSession) -> None:
        await session.stream(message)


@ai_endpoint("/atmosphere/ai-chat", harness=(Harness.ALL,))
class Chat:
    """A plain AI endpoint given the whole harness."""

    @prompt
    async def chat(self, message: str, session: StreamingSession) -> None:
        await session.stream(message)


def create_app(settings: HarnessSettings | None = None) -> FastAPI:
    """The sample app; `settings=None` reads them from the environment when it starts."""
    app = FastAPI(title="atmosphere-harness personal assistant")
    # The fleet's classes are hosted with their coordinator: listing it is enough.
    app.include_router(create_harness_router(settings, agents=[Assistant, Chat]))
    return app


app = create_app()
