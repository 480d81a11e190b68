"""The "usage limits" run hooks: what one run may spend (`UsageLimits`), enforced around every
model and tool call, and what one user may spend per UTC day (`UserDailyTokensHook`).

Counts live in the state of each run that has limits (the top-level run: its agent's
`usage_limits=`, else the app-wide `ATMOSPHERE_AI_USAGE_LIMITS`; a fleet member that declares
its own: those too, over its own part). Every model request and tool call of a run and of
everything under it (`task` sub-agents, fleet members) adds to each such count above it, so a
coordinator's budget covers its fleet. The hook sits outside durable replay: a replayed turn
of a resumed run still counts, so a restart never buys a run more than its limits.

Request and tool-call limits are checked before the call that would exceed them; token limits
after each response, before its tool calls run. Once a count is over, every later call under
that run fails at once with the same `UsageLimitExceeded` (a fleet member's error must not
let its coordinator ask the model again).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime

from .._contracts import (
    Key,
    ModelStep,
    ProceedModel,
    ProceedTool,
    Run,
    RunHooks,
    TokenGrant,
    ToolOutcome,
    ToolStep,
    UserTokens,
)
from .._errors import UsageLimitExceeded
from .._limits import UsageLimits
from .._log import fault, get_logger
from .._runtimes.base import ModelRequest, ModelResponse

log = get_logger(__name__)


@dataclass(slots=True)
class Tally:
    """What a run and everything under it spent so far."""

    requests: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    tool_calls: int = 0
    ended: UsageLimitExceeded | None = None
    """The limit that ended the run, raised again for any later call under it."""


TALLY: Key[Tally] = Key("usage.tally")
"""Run state: the counts of a run that has limits."""


class UsageLimitsHook(RunHooks):
    """Ends a run (an `error` frame, `UsageLimitExceeded`) at the first call over a limit."""

    def __init__(self, app_limits: UsageLimits) -> None:
        self.app_limits = app_limits

    def limits_of(self, run: Run) -> UsageLimits | None:
        """A run's own limits: its agent's, else (top-level runs only) the app-wide ones."""
        spec = run.endpoint.spec
        if spec is not None and spec.usage_limits is not None:
            return spec.usage_limits if spec.usage_limits.any else None
        if run.parent is None and self.app_limits.any:
            return self.app_limits
        return None

    def _budgets(self, run: Run) -> list[tuple[UsageLimits, Tally]]:
        budgets: list[tuple[UsageLimits, Tally]] = []
        current: Run | None = run
        while current is not None:
            limits = self.limits_of(current)
            if limits is not None:
                budgets.append((limits, current.state.setdefault(TALLY, Tally)))
            current = current.parent
        return budgets

    async def around_model(self, step: ModelStep, proceed: ProceedModel) -> ModelResponse:
        budgets = self._budgets(step.run)
        if not budgets:
            return await proceed(step)
        for limits, tally in budgets:
            _check_ended(tally)
            if limits.request_limit is not None and tally.requests >= limits.request_limit:
                _end(tally, "request_limit", limits.request_limit, "model requests")
        for _, tally in budgets:
            tally.requests += 1
        response = await proceed(step)
        usage = response.usage
        for _, tally in budgets:
            tally.input_tokens += usage.input_tokens
            tally.output_tokens += usage.output_tokens
        for limits, tally in budgets:
            over = _token_limit_passed(limits, tally)
            if over is not None:
                # The loop adds a response's usage once the hooks return; this one never
                # returns, and what it cost still belongs to the run.
                step.run.add_usage(usage)
                _end(tally, *over)
        return response

    async def around_tool(self, step: ToolStep, proceed: ProceedTool) -> ToolOutcome:
        budgets = self._budgets(step.run)
        if not budgets or step.tool is None or step.refusal is not None:
            return await proceed(step)
        for limits, tally in budgets:
            _check_ended(tally)
            if limits.tool_calls_limit is not None and tally.tool_calls >= limits.tool_calls_limit:
                _end(tally, "tool_calls_limit", limits.tool_calls_limit, "tool calls")
        for _, tally in budgets:
            tally.tool_calls += 1
        return await proceed(step)


def _token_limit_passed(limits: UsageLimits, tally: Tally) -> tuple[str, int, str] | None:
    spent = (
        ("input_tokens_limit", limits.input_tokens_limit, tally.input_tokens, "input tokens"),
        ("output_tokens_limit", limits.output_tokens_limit, tally.output_tokens, "output tokens"),
        (
            "total_tokens_limit",
            limits.total_tokens_limit,
            tally.input_tokens + tally.output_tokens,
            "tokens",
        ),
    )
    for name, bound, value, what in spent:
        if bound is not None and value > bound:
            return name, bound, what
    return None


def _check_ended(tally: Tally) -> None:
    if tally.ended is not None:
        raise UsageLimitExceeded(str(tally.ended), limit=tally.ended.limit)


def _end(tally: Tally, limit: str, bound: int, what: str) -> None:
    error = UsageLimitExceeded(
        f"the run reached its {limit} ({bound} {what}) and was stopped", limit=limit
    )
    tally.ended = error
    raise error


# --- the per-user daily token cap -----------------------------------------------------------

DAILY_LIMIT = "user_daily_token_limit"


def utc_day(now: float | None = None) -> str:
    """`YYYY-MM-DD` of `now` (epoch seconds, default: now) in UTC."""
    moment = datetime.now(UTC) if now is None else datetime.fromtimestamp(now, UTC)
    return moment.strftime("%Y-%m-%d")


class InProcessUserTokens:
    """`UserTokens` of one process: a dict that keeps only the current day's counts."""

    name = "local"

    def __init__(self) -> None:
        self._day = ""
        self._spent: dict[str, int] = {}
        self._last: dict[str, int] = {}

    def _today(self, day: str) -> bool:
        """Start a new day's counts when `day` is newer; whether `day` is the current one."""
        if day > self._day:
            self._day, self._spent, self._last = day, {}, {}
        return day == self._day

    async def spent(self, user_id: str, day: str) -> int:
        return self._spent.get(user_id, 0) if day == self._day else 0

    async def add(self, user_id: str, day: str, tokens: int) -> int:
        if not self._today(day):
            return 0
        self._spent[user_id] = self._spent.get(user_id, 0) + tokens
        return self._spent[user_id]

    async def reserve(self, user_id: str, day: str, estimate: int, limit: int) -> int | None:
        if not self._today(day):
            return 0
        if self._spent.get(user_id, 0) >= limit:
            return None
        reserved = max(estimate, self._last.get(user_id, 0), 1)
        self._spent[user_id] = self._spent.get(user_id, 0) + reserved
        return reserved

    async def settle(
        self, user_id: str, day: str, reserved: int, used: int, *, remember: bool
    ) -> None:
        if not self._today(day):
            return
        self._spent[user_id] = max(self._spent.get(user_id, 0) + used - reserved, 0)
        if remember and used > 0:
            self._last[user_id] = used


LAST_CALL: Key[int] = Key("usage.last_call")
"""Run state: the tokens of the run's last model call (the next reservation's floor)."""


def estimate_tokens(request: ModelRequest) -> int:
    """About how many tokens `request` sends: its characters / 4 (system prompt, messages,
    per-turn context, tool declarations)."""
    chars = len(request.system_prompt) + sum(len(part) for part in request.context)
    for message in request.messages:
        chars += len(message.content) + 16
        for call in message.tool_calls:
            chars += len(call.name) + len(str(call.arguments))
    for spec in request.tools:
        chars += len(spec.name) + len(spec.description) + len(str(spec.parameters))
    return chars // 4


class UserDailyTokensHook(RunHooks):
    """Refuses a model request once its user's tokens today (UTC) reach `limit`, every
    replica's runs together, the harness's own calls (compaction summaries, fact extraction)
    included.

    Before each call a reservation is added to the user's count in one atomic step of the
    store, and only while the count is under the limit: the larger of the request's estimated
    size, the run's last call and the user's last call. The call's real usage replaces the
    reservation when it ends (a failed call releases it). Concurrent calls therefore see each
    other's reservations, and the cap is passed by at most the last call admitted under it,
    plus what calls in flight spend beyond their reservation.

    Anonymous runs (no user id) are not capped. It sits inside durable replay: a resumed run's
    replayed turns were counted in its first life and are not counted again. The store failing
    (an outage) does not stop runs: the call goes ahead and a WARN says what was not counted.
    """

    def __init__(self, store: UserTokens, limit: int) -> None:
        self.store = store
        self.limit = limit
        self._settling: set[asyncio.Future[None]] = set()

    async def around_model(self, step: ModelStep, proceed: ProceedModel) -> ModelResponse:
        run = step.run
        user = run.user_id
        if user is None:
            return await proceed(step)
        estimate = max(estimate_tokens(step.request), run.state.get(LAST_CALL, 0))
        async with self.reserve(user, estimate, remember=True) as grant:
            response = await proceed(step)
            usage = response.usage
            grant.used = usage.input_tokens + usage.output_tokens
            run.state.set(LAST_CALL, grant.used)
        return response

    @asynccontextmanager
    async def reserve(
        self, user_id: str, estimate: int, *, remember: bool = False
    ) -> AsyncIterator[TokenGrant]:
        """`contracts.UserDailyCap.reserve`: the reservation around one call."""
        day = utc_day()
        try:
            reserved = await self.store.reserve(user_id, day, estimate, self.limit)
        except Exception as exc:
            fault(log, "the daily token count could not be read; the call goes ahead", exc)
            reserved = 0
        if reserved is None:
            raise UsageLimitExceeded(
                f"this user reached the daily token limit ({self.limit} tokens per UTC day, "
                "ATMOSPHERE_AI_USER_DAILY_TOKEN_LIMIT); try again tomorrow",
                limit=DAILY_LIMIT,
            )
        grant = TokenGrant()
        try:
            yield grant
        finally:
            if reserved or grant.used:
                # Shielded: a cancelled run still gives back what it reserved and did not use.
                settling = asyncio.ensure_future(
                    self._settle(user_id, day, reserved, grant.used, remember)
                )
                self._settling.add(settling)
                settling.add_done_callback(self._settling.discard)
                await asyncio.shield(settling)

    async def _settle(self, user: str, day: str, reserved: int, used: int, remember: bool) -> None:
        try:
            await self.store.settle(user, day, reserved, used, remember=remember)
        except Exception as exc:
            fault(log, "the daily token count could not be written", exc, tokens=used)
