"""`PostgresPlanStore`: one plan per agent and conversation, in PostgreSQL, per owner.

The embedded store keeps plans as files under each owner's root; this one keeps them as rows
keyed by that root (relative to `workspace_root`, so every replica names it alike), the agent
and the conversation. Keys, step and size bounds are checked exactly as `FilePlanStore` checks
them (same messages for the model), and a rejected plan leaves the stored one untouched.

The cap (plans per owner) never evicts a plan that is in use: when a new plan goes over it, the
least recently written plans are deleted only if nothing wrote them for `protect_seconds` (by
default the conversation idle timeout: a conversation quiet that long has been closed). If every
plan is younger, the store goes over the cap for a while instead (with a WARN), since deleting
the plan of a conversation another replica is running would lose the agent's work.
"""

from __future__ import annotations

import time
from typing import Any

from ..._log import get_logger
from ..._planning.model import AgentPlan
from ..._planning.store import (
    MAX_PLAN_BYTES,
    MAX_PLAN_FILES,
    MAX_STEPS,
    check_key,
    checked_put,
)
from .database import PostgresDatabase

log = get_logger(__name__)

PROTECT_SECONDS = 1800.0


class PostgresPlanStore:
    """A `planning.PlanStore` whose plans every replica reads and writes."""

    def __init__(
        self,
        database: PostgresDatabase,
        owner: str,
        *,
        max_steps: int = MAX_STEPS,
        max_plan_bytes: int = MAX_PLAN_BYTES,
        max_plans: int = MAX_PLAN_FILES,
        protect_seconds: float = PROTECT_SECONDS,
    ) -> None:
        if min(max_steps, max_plan_bytes, max_plans) <= 0:
            raise ValueError("plan store limits must be positive")
        self.database = database
        self.owner = owner
        self.max_steps = max_steps
        self.max_plan_bytes = max_plan_bytes
        self.max_plans = max_plans
        self.protect_seconds = protect_seconds

    def __repr__(self) -> str:
        return f"PostgresPlanStore(owner={self.owner!r})"

    async def get(self, agent_id: str, conversation_id: str) -> AgentPlan | None:
        agent = check_key("agentId", agent_id)
        conversation = check_key("conversationId", conversation_id)

        async def work(connection: Any) -> str | None:
            value: str | None = await connection.fetchval(
                "SELECT plan FROM atmosphere_plans WHERE owner = $1 AND agent_id = $2 "
                "AND conversation_id = $3",
                self.owner,
                agent,
                conversation,
            )
            return value

        text = await self.database.run(work)
        if text is None:
            return None
        try:
            return AgentPlan.from_json(text)
        except (ValueError, TypeError) as exc:
            log.warning("corrupt plan row; reading it as empty", owner=self.owner, error=exc)
            return None

    async def put(self, agent_id: str, conversation_id: str, plan: AgentPlan) -> None:
        agent, conversation, encoded = checked_put(
            agent_id,
            conversation_id,
            plan,
            max_steps=self.max_steps,
            max_plan_bytes=self.max_plan_bytes,
        )
        text = encoded.decode("utf-8")
        now = time.time()

        async def work(connection: Any) -> int:
            async with connection.transaction():
                created: bool = await connection.fetchval(
                    "INSERT INTO atmosphere_plans (owner, agent_id, conversation_id, plan, "
                    "updated_at) VALUES ($1, $2, $3, $4, $5) ON CONFLICT (owner, agent_id, "
                    "conversation_id) DO UPDATE SET plan = excluded.plan, "
                    "updated_at = excluded.updated_at RETURNING (xmax = 0)",
                    self.owner,
                    agent,
                    conversation,
                    text,
                    now,
                )
                if not created:
                    return 0
                count = int(
                    await connection.fetchval(
                        "SELECT count(*) FROM atmosphere_plans WHERE owner = $1", self.owner
                    )
                )
                if count <= self.max_plans:
                    return 0
                deleted = await connection.fetch(
                    "DELETE FROM atmosphere_plans WHERE ctid IN (SELECT ctid FROM "
                    "atmosphere_plans WHERE owner = $1 AND updated_at < $2 "
                    "ORDER BY updated_at LIMIT $3) RETURNING 1",
                    self.owner,
                    now - self.protect_seconds,
                    count - self.max_plans,
                )
                return count - self.max_plans - len(deleted)

        over = await self.database.run(work)
        if over > 0:
            log.warning(
                "plan cap exceeded: the remaining plans are in use",
                owner=self.owner,
                cap=self.max_plans,
                over=over,
            )

    async def forget(self, conversation_id: str) -> None:
        """Delete every plan of the conversation (each agent's)."""
        conversation = check_key("conversationId", conversation_id)

        async def work(connection: Any) -> None:
            await connection.execute(
                "DELETE FROM atmosphere_plans WHERE owner = $1 AND conversation_id = $2",
                self.owner,
                conversation,
            )

        await self.database.run(work)
