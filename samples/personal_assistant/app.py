"""The personal assistant: a complete deep agent in a few lines.

Run it with `make demo` (or `python -m samples.personal_assistant`); with no model configured the
built-in scripted demo runtime answers, so it works offline.
"""

from __future__ import annotations

from fastapi import FastAPI

from atmosphere_harness import StreamingSession, agent, create_harness_router, prompt


@agent(name="assistant")
class Assistant:
    """A personal assistant that plans, keeps notes in its workspace and remembers you."""

    @prompt
    async def chat(self, message: str, session: StreamingSession) -> None:
        await session.stream(message)


def create_app() -> FastAPI:
    app = FastAPI(title="atmosphere-harness personal assistant")
    app.include_router(create_harness_router(agents=[Assistant]))
    return app


app = create_app()
