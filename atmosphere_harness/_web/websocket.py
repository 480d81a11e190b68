"""`WS P/ws`: prompts in, the same frames out, on one long-lived socket.

The client sends a prompt as JSON text, the body of `POST P` (`{"message", "conversationId"?}`)
or that body wrapped as a frame (`{"event": "prompt", "data": {...}}`); without a
`conversationId` it continues the socket's conversation (`?conversationId=` when connecting, a
new id otherwise). The server answers with the run's frames, exactly the JSON of the SSE
`data:` lines. Prompts of one socket run one after another, in the order sent.

A prompt's `multitask` (as for `POST P`) is applied when the socket receives it, not when its
turn comes: `reject` is answered at once with an error message of type `RunConflict` while the
conversation has a run in flight; `interrupt` and `rollback` stop the runs in flight at once
(the socket's own running prompt ends with its `RunCancelled` frame), and the prompt runs next.

Besides run frames, the server sends two messages that belong to no run (no `sessionId`, no
`seq`): `{"event": "heartbeat", "data": {}}` every `HEARTBEAT_SECONDS`, so a browser can tell a
live socket from a dead one, and `{"event": "error", "data": {"message", "type"}}` for a client
message that is not a prompt (the socket stays open), JSON nested too deeply to parse included.

Origins: browsers apply no CORS to WebSockets and send the site's cookies along, so a handshake
whose `Origin` is neither the app's own nor listed in `websocket_allowed_origins`
(`ATMOSPHERE_WEBSOCKET_ALLOWED_ORIGINS`) is refused (HTTP 403). Clients that are not browsers
send no `Origin` and are not affected.

Flow control: each socket has its own bounded send queue and sender task. A client that reads
slowly slows only its own run (the run waits for room, as over SSE); one whose pending send does
not complete within `SEND_TIMEOUT` seconds is disconnected. A disconnect, either way, cancels the
running prompt and closes every conversation the socket used (`HarnessHost.close_conversation`:
long-term-memory extraction runs in the background).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, WebSocket, WebSocketDisconnect, WebSocketException
from pydantic import ValidationError
from starlette.responses import JSONResponse
from starlette.websockets import WebSocketState

from .._errors import RunConflict
from .._ids import check_conversation_id, new_conversation_id
from .._kernel.control import RunTicket
from .._kernel.endpoint import HostedEndpoint
from .._kernel.host import HarnessHost
from .._log import get_logger
from .._registry import AgentSpec
from .deps import HarnessDep, get_user_id, not_hosted
from .route_spec import PromptRequest, RouteSpec
from .sse import QUEUE_FRAMES, admit, run_frames

log = get_logger(__name__)

HEARTBEAT_SECONDS = 15.0
SEND_TIMEOUT = 30.0
MAX_QUEUED_PROMPTS = 16
MAX_TEXT_CHARS = 4 * 1024 * 1024
"""Longest client message parsed, in characters (a prompt is at most 1,000,000 of them)."""

SLOW_CLIENT = 1008
"""Close code sent to a client that stopped reading (policy violation)."""

HEARTBEAT = json.dumps({"event": "heartbeat", "data": {}}, separators=(",", ":"))


def _notice(message: str, kind: str) -> str:
    body = {"event": "error", "data": {"message": message, "type": kind}}
    return json.dumps(body, ensure_ascii=False, separators=(",", ":"))


@dataclass(frozen=True)
class _Prompt:
    """A prompt waiting on its socket; `ticket`: its run, stored already by its `multitask`."""

    message: str
    conversation_id: str
    ticket: RunTicket | None


class _Socket:
    """The state of one connection: its queues, its conversations, its tasks."""

    def __init__(
        self,
        websocket: WebSocket,
        host: HarnessHost,
        endpoint: HostedEndpoint,
        user_id: str | None,
        conversation_id: str,
    ) -> None:
        self.websocket = websocket
        self.host = host
        self.endpoint = endpoint
        self.user_id = user_id
        self.conversation_id = conversation_id
        self.outbox: asyncio.Queue[str] = asyncio.Queue(maxsize=QUEUE_FRAMES)
        self.prompts: asyncio.Queue[_Prompt] = asyncio.Queue(maxsize=MAX_QUEUED_PROMPTS)
        self.used: set[str] = set()

    async def serve(self) -> None:
        tasks = [
            asyncio.create_task(self._send(), name="ws-send"),
            asyncio.create_task(self._receive(), name="ws-receive"),
            asyncio.create_task(self._run_prompts(), name="ws-prompts"),
            asyncio.create_task(self._heartbeat(), name="ws-heartbeat"),
        ]
        try:
            # The sender ends on a send failure or timeout, the receiver on a disconnect; the
            # prompt worker never ends unless something failed.
            done, _ = await asyncio.wait(tasks[:3], return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                if not task.cancelled() and task.exception() is not None:
                    log.error(
                        "websocket task failed", task=task.get_name(), exc_info=task.exception()
                    )
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            while not self.prompts.empty():
                waiting = self.prompts.get_nowait().ticket
                if waiting is not None:  # stored by its `multitask`, never started
                    waiting.finish("cancelled")
            for conversation in sorted(self.used):
                await self.host.close_conversation(self.endpoint.path, conversation, self.user_id)
            if self.websocket.application_state is WebSocketState.CONNECTED:
                with contextlib.suppress(Exception):
                    await self.websocket.close()

    async def _send(self) -> None:
        while True:
            text = await self.outbox.get()
            try:
                async with asyncio.timeout(SEND_TIMEOUT):
                    await self.websocket.send_text(text)
            except TimeoutError:
                log.warning(
                    "websocket client stopped reading; disconnecting it",
                    endpoint=self.endpoint.path,
                    timeout=SEND_TIMEOUT,
                )
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(
                        self.websocket.close(SLOW_CLIENT, "the client stopped reading"), 1.0
                    )
                return
            except Exception:
                return  # the connection is gone; the receiver sees the disconnect too

    async def _receive(self) -> None:
        while True:
            try:
                text = await self.websocket.receive_text()
            except (WebSocketDisconnect, RuntimeError):
                return
            except KeyError:  # a binary message: receive_text() finds no "text"
                self._tell(_notice("send prompts as JSON text messages", "invalid_request"))
                continue
            if len(text) > MAX_TEXT_CHARS:
                self._tell(_notice("message too large", "invalid_request"))
                continue
            request = self._parse(text)
            if request is None:
                continue
            if self.prompts.full():  # (only this task adds to the queue)
                self._tell(
                    _notice(
                        f"{MAX_QUEUED_PROMPTS} prompts are already waiting on this socket",
                        "busy",
                    )
                )
                continue
            prompt = await self._admit(request)
            if prompt is not None:
                self.prompts.put_nowait(prompt)

    async def _admit(self, request: PromptRequest) -> _Prompt | None:
        """Claim the prompt's conversation and apply its `multitask` as it arrives."""
        conversation_id = request.conversationId or self.conversation_id
        if not await self.host.access.claim(
            self.endpoint.path, conversation_id, self.user_id, request.message
        ):
            self._tell(_notice(f"unknown conversation {conversation_id!r}", "not_found"))
            return None
        self.used.add(conversation_id)
        try:
            ticket = await admit(
                self.host,
                self.endpoint,
                message=request.message,
                conversation_id=conversation_id,
                user_id=self.user_id,
                multitask=request.multitask,
            )
        except RunConflict as exc:
            self._tell(_notice(str(exc), type(exc).__name__))
            return None
        return _Prompt(request.message, conversation_id, ticket)

    def _parse(self, text: str) -> PromptRequest | None:

        try:
            body: Any = json.loads(text)
            if isinstance(body, dict) and body.get("event") == "prompt":
                body = body.get("data")
            request = PromptRequest.model_validate(body)
        except (ValueError, ValidationError) as exc:
            self._tell(_notice(_reason(exc), "invalid_request"))
            return None
        except RecursionError:
            # json.loads recurses once per level: thousands of `[` exhaust the stack. The parser
            # unwinds cleanly, so this message is refused and the socket carries on.
            self._tell(_notice("invalid prompt: JSON nested too deeply", "invalid_request"))
            return None
        return request

    async def _run_prompts(self) -> None:
        while True:
            prompt = await self.prompts.get()
            frames = run_frames(
                self.host,
                self.endpoint,
                message=prompt.message,
                conversation_id=prompt.conversation_id,
                user_id=self.user_id,
                ticket=prompt.ticket,
                headers=self.websocket.headers,
            )
            async with contextlib.aclosing(frames):
                async for frame in frames:
                    await self.outbox.put(frame.to_json())

    async def _heartbeat(self) -> None:
        while True:
            await asyncio.sleep(HEARTBEAT_SECONDS)
            self._tell(HEARTBEAT)

    def _tell(self, text: str) -> None:
        """Queue a message that belongs to no run; dropped if the client is that far behind."""
        with contextlib.suppress(asyncio.QueueFull):
            self.outbox.put_nowait(text)


def _reason(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first.get("loc", ())) or "body"
        return f"invalid prompt ({where}): {first.get('msg', 'invalid')}"
    return f"invalid prompt: not JSON ({exc})"


def origin_allowed(websocket: WebSocket, allowed: frozenset[str]) -> bool:
    """Same-origin (or listed) browsers only; clients that send no `Origin` are not browsers."""
    origin = websocket.headers.get("origin")
    if origin is None or "*" in allowed:
        return True
    if origin.rstrip("/") in {entry.rstrip("/") for entry in allowed}:
        return True
    host = websocket.headers.get("host", "")
    return origin.split("://", 1)[-1].rstrip("/") == host


NOT_FOUND_CLOSE = 4404
"""Close code of a handshake refused with 404 when the server cannot answer it in HTTP."""


async def refuse(
    websocket: WebSocket, status: int, message: str, *, close_code: int = NOT_FOUND_CLOSE
) -> None:
    """Refuse a handshake with an HTTP `status` and `{"error": message}`, before accepting it.

    Servers that support the WebSocket Denial Response extension (uvicorn does) send the HTTP
    answer; otherwise the socket is accepted and closed at once with `close_code`.
    """
    if "websocket.http.response" in websocket.scope.get("extensions", {}):
        await websocket.send_denial_response(JSONResponse({"error": message}, status_code=status))
        return
    await websocket.accept()
    await websocket.close(code=close_code, reason=message[:120])


def websocket_routes(spec: AgentSpec) -> list[RouteSpec]:

    async def prompt_socket(
        websocket: WebSocket,
        host: HarnessDep,
        user_id: Annotated[str | None, Depends(get_user_id)],
    ) -> None:
        endpoint = host.endpoint(spec.path)
        if endpoint is None:
            log.error(not_hosted(spec.path))
            raise WebSocketException(code=1011, reason="endpoint not hosted")
        if not origin_allowed(websocket, host.settings.groups.admin.websocket_allowed_origins):
            log.warning(
                "websocket from another origin refused",
                origin=websocket.headers.get("origin"),
                endpoint=endpoint.path,
            )
            await websocket.close(code=1008, reason="origin not allowed")
            return
        requested = websocket.query_params.get("conversationId")
        if requested is None:
            conversation_id = new_conversation_id()
        else:
            try:
                conversation_id = check_conversation_id(requested)
            except ValueError as exc:
                await refuse(websocket, 400, str(exc), close_code=1008)
                return
            # An id nobody owns yet is fine: the socket's first prompt claims it.
            if await host.access.taken(endpoint.path, conversation_id, user_id):
                await refuse(websocket, 404, f"unknown conversation {conversation_id!r}")
                return
        await websocket.accept()
        await _Socket(websocket, host, endpoint, user_id, conversation_id).serve()

    return [
        RouteSpec(
            spec.path + "/ws",
            prompt_socket,
            websocket=True,
            options={"name": f"ws:{spec.path}"},
        )
    ]
