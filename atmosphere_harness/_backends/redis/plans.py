"""`RedisPlanStore`: each owner's plans in Redis, so any replica reads what another wrote.

One store per owner root, as with `FilePlanStore`; the owner is named by the root's last two
parts (`agents/assistant`), so every replica on one workspace root maps an owner to the same
keys. A plan is one string key holding its JSON; the owner's plans are also a sorted set by last
write, which is how the cap (`max_plans` per owner, like the file store's) finds the least
recently written. Keys, steps and bytes are checked exactly as in `FilePlanStore`, before
anything is written.

The cap never evicts a plan written in the last `min_idle` seconds (a run on another replica may
be using it): past the cap, older plans go first; if every plan is that recent, the write is
still accepted up to twice the cap, and refused with a clear message beyond that.
"""

from __future__ import annotations

import time
from pathlib import Path

from ..._errors import PlanStoreError
from ..._log import get_logger
from ..._planning.model import AgentPlan
from ..._planning.store import MAX_PLAN_BYTES, MAX_PLAN_FILES, MAX_STEPS, check_key, checked_put
from .connection import RedisConnection, as_str, digest

log = get_logger(__name__)

MIN_IDLE = 300.0

_PUT = """
local exists = redis.call('EXISTS', KEYS[1])
local cap, now, min_idle = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local evicted = 0
if exists == 0 then
    local count = redis.call('ZCARD', KEYS[2])
    if count >= cap then
        local target = cap - 1 - math.floor(cap / 8)
        local old = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', '(' .. (now - min_idle),
            'LIMIT', 0, count - target)
        for _, name in ipairs(old) do
            redis.call('DEL', ARGV[6] .. name)
            redis.call('ZREM', KEYS[2], name)
            local of = redis.call('HGET', KEYS[3], name)
            if of then redis.call('SREM', ARGV[6] .. 'conversation:' .. of, name) end
            redis.call('HDEL', KEYS[3], name)
            evicted = evicted + 1
        end
        if count - evicted >= 2 * cap then return -1 end
    end
end
redis.call('SET', KEYS[1], ARGV[1])
redis.call('ZADD', KEYS[2], now, ARGV[2])
redis.call('HSET', KEYS[3], ARGV[2], ARGV[7])
redis.call('SADD', ARGV[6] .. 'conversation:' .. ARGV[7], ARGV[2])
return evicted
"""
# KEYS: plan key, owner's index, owner's plan -> conversation hash.
# ARGV: plan JSON, plan name, cap, now, min idle, key base, conversation digest.

_FORGET = """
for _, name in ipairs(redis.call('SMEMBERS', KEYS[3])) do
    redis.call('DEL', ARGV[1] .. name)
    redis.call('ZREM', KEYS[1], name)
    redis.call('HDEL', KEYS[2], name)
end
redis.call('DEL', KEYS[3])
return 1
"""
# KEYS: owner's index, owner's plan -> conversation hash, the conversation's plans.
# ARGV: key base.


class RedisPlanStore:
    """A `planning.PlanStore` for one owner, in Redis (see the module docstring)."""

    def __init__(
        self,
        connection: RedisConnection,
        owner: str,
        *,
        max_steps: int = MAX_STEPS,
        max_plan_bytes: int = MAX_PLAN_BYTES,
        max_plans: int = MAX_PLAN_FILES,
        min_idle: float = MIN_IDLE,
    ) -> None:
        if min(max_steps, max_plan_bytes, max_plans) <= 0 or min_idle < 0:
            raise ValueError("plan store limits must be positive")
        self.connection = connection
        self.owner = owner
        self.max_steps = max_steps
        self.max_plan_bytes = max_plan_bytes
        self.max_plans = max_plans
        self.min_idle = min_idle
        self._base = connection.key("plan", digest(owner), "")
        self._put = connection.script(_PUT)
        self._forget = connection.script(_FORGET)

    @classmethod
    def for_root(cls, connection: RedisConnection, root: Path) -> RedisPlanStore:
        """The store of the owner whose workspace directory is `root`."""
        return cls(connection, f"{root.parent.name}/{root.name}")

    def __repr__(self) -> str:
        return f"RedisPlanStore({self.owner!r})"

    @staticmethod
    def _name(agent: str, conversation: str) -> str:
        return digest(agent, conversation)

    async def get(self, agent_id: str, conversation_id: str) -> AgentPlan | None:
        agent = check_key("agentId", agent_id)
        conversation = check_key("conversationId", conversation_id)
        with self.connection.unavailable("reading the plan"):
            stored = await self.connection.client.get(self._base + self._name(agent, conversation))
        text = as_str(stored)
        if text is None:
            return None
        try:
            return AgentPlan.from_json(text)
        except (ValueError, TypeError) as exc:
            log.warning("corrupt plan in Redis; reading it as empty", owner=self.owner, error=exc)
            return None

    async def put(self, agent_id: str, conversation_id: str, plan: AgentPlan) -> None:
        agent, conversation, encoded = checked_put(
            agent_id,
            conversation_id,
            plan,
            max_steps=self.max_steps,
            max_plan_bytes=self.max_plan_bytes,
        )
        data = encoded.decode("utf-8")
        name = self._name(agent, conversation)
        with self.connection.unavailable("saving the plan"):
            evicted = int(
                await self._put(
                    keys=[self._base + name, self._base + "index", self._base + "of"],
                    args=[
                        data,
                        name,
                        self.max_plans,
                        repr(time.time()),
                        self.min_idle,
                        self._base,
                        digest(conversation),
                    ],
                )
            )
        if evicted < 0:
            raise PlanStoreError(
                f"plan rejected: {self.owner} already has {2 * self.max_plans} plans in use; "
                "try again later"
            )
        if evicted:
            log.warning(
                "plan cap reached; evicted the least recently written plans",
                evicted=evicted,
                cap=self.max_plans,
                owner=self.owner,
            )

    async def forget(self, conversation_id: str) -> None:
        """Delete every plan of the conversation (each agent's)."""
        conversation = check_key("conversationId", conversation_id)
        with self.connection.unavailable("deleting the conversation's plans"):
            await self._forget(
                keys=[
                    self._base + "index",
                    self._base + "of",
                    self._base + "conversation:" + digest(conversation),
                ],
                args=[self._base],
            )
