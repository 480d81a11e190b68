"""`PostgresRunStore`: durable runs journalled in PostgreSQL, so any replica can resume them.

The same three tables as the embedded `durable.SqliteRunStore` (migration 3): one row per run
(who, where, the message, the lease), its frames and its checkpoints, as JSON text (PostgreSQL
compresses values past ~2 kB itself, TOAST). What makes it a multi-replica store:

- Leases are stamped with the database's clock (`clock_timestamp()`), never a replica's, so two
  hosts whose clocks disagree still agree on when a lease ran out.
- `claim` is one `UPDATE ... WHERE id IN (SELECT ... FOR UPDATE SKIP LOCKED) RETURNING`: two
  replicas claiming at once lock disjoint rows, so a run is never handed to both.
- `append` is fenced: with an `owner`, it locks the run row and writes only while that owner
  still holds the run. A replica that stalled past its lease (a long GC pause, a partition) and
  lost the run to another gets `LeaseLost` instead of writing into the new owner's journal.
- Unlike the embedded store, a dead owner is never guessed from its pid: replicas on one host
  name may be different containers (each with its pid 1), so only the lease decides. A
  replica restarted in place therefore resumes its runs once their lease ran out
  (`ATMOSPHERE_DURABLE_RUNS_LEASE_SECONDS`, 15 s by default); a graceful stop `release`s them
  at once.
- It is a `contracts.RunFeed`: another replica follows a run from its rows (`latest`,
  `frames_after`, and `load` for the model turns a `tool-start` frame refers to). So that
  such a reader sees a run's last frames, `finish` marks the run finished at once but deletes
  its frames and checkpoints `FOLLOW_GRACE_SECONDS` later (in `expire`, which the journal
  calls every third of a lease, and which reads only the runs finished since its last call).
- It is also the frame feed (durable runs off): runs owned as `FEED_OWNER`... are never
  claimed; their appends are one statement each, commit with `synchronous_commit = off` (no
  wait for the WAL flush: the feed is not durability), finish the run when their last frame is
  terminal, and are refused once the run is finished; `abandon` ends those
  whose replica died (lease run out) with a terminal `error` frame.
- Each write of frames also sends `NOTIFY atmosphere_run_{digest}, '{seq} {run_id}'` (the
  run's own channel, `channel`) from the same statement (no round trip of its own; PostgreSQL
  delivers it once the write commits), but only while a replica follows the run: a replica
  `LISTEN`s on a run's channel while it has a reader following that run (`watch`), which reads
  the new frames at once instead of at its next poll, and counts itself in the run's
  `followers` meanwhile. A run nobody follows sends no notice: every `NOTIFY` wakes the
  PostgreSQL backend of every replica's `LISTEN` connection (it reads the queue in a
  transaction of its own, whatever the channel), so unconditional notices cost PostgreSQL
  CPU in proportion to the replicas, for every write.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Sequence
from typing import Any

from ..._contracts import FEED_OWNER, AskListener, StoredRun
from ..._errors import LeaseLost
from ..._events import TERMINAL, Frame
from ..._kernel.remote import RunWatchers, ask_payload, deliver_ask
from ..._log import fault, get_logger
from .database import PostgresDatabase

log = get_logger(__name__)

NOW = "extract(epoch FROM clock_timestamp())"
"""The database's clock, in epoch seconds: what every lease is measured against."""

FOLLOW_GRACE_SECONDS = 30.0
"""How long a finished run's frames stay for readers on other replicas to catch up."""

DROP_SLACK_SECONDS = 10.0
"""How far back each `expire` looks again, past where the previous one stopped dropping frames:
room for replicas' clocks to disagree and for a run's `finish` to commit late. Frames a replica
never got to in time (all replicas stopped for longer) go with their run's row, `keep_seconds`
after it finished (`ON DELETE CASCADE`)."""

CHANNEL = "atmosphere_run_"
"""Each run's notices go to `CHANNEL` + a digest of its id (`channel`): only a replica with a
reader of that run `LISTEN`s there (`RunFeed.watch`), so the others receive none of them."""


ASK_CHANNEL = "atmosphere_run_asks"
"""Where a replica asks the others to share a run in the frame feed (`RunFeed.ask`): every
replica with a frame feed `LISTEN`s to it."""


def channel(run_id: str) -> str:
    """The run's notice channel (a digest: any run id, within the 63 bytes of a name)."""
    return (
        CHANNEL
        + hashlib.blake2b(run_id.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()
    )


def notice(param: int, followed: str) -> str:
    """A statement's `WITH` entry that announces its frames on the run's channel (`$param`,
    `channel`) if a replica follows the run (`followed`: a query of the run's `followers`,
    made after the statement locked or wrote the row): `$1` the run id, `$2` the seqs (text,
    oldest first). Always one row (what it sent), so that joined into the `INSERT` it runs
    once, whether it sent anything or not."""
    return (
        "notice AS (SELECT count(*) AS sent FROM (SELECT pg_notify("
        f"${param}::text, ($2::text[])[cardinality($2::text[])] || ' ' || $1::text) "
        f"FROM ({followed}) AS run WHERE run.followers > 0) AS sent)"
    )


RUN_COLUMNS = "id, run_id, path, conversation_id, user_key, session_id, message, started_at"

APPEND_FEEDS = (
    "WITH relaxed AS (SELECT set_config('synchronous_commit', 'off', true)), "
    "run AS (SELECT id, run_id, followers FROM atmosphere_runs, relaxed "
    "WHERE run_id = ANY($5::text[]) "
    "AND owner = $8 AND finished_at IS NULL ORDER BY id FOR NO KEY UPDATE OF atmosphere_runs), "
    "written AS (INSERT INTO atmosphere_run_frames (run, seq, event, data) "
    "SELECT run.id, f.seq::integer, f.event, f.data FROM run JOIN "
    "unnest($1::text[], $2::text[], $3::text[], $4::text[]) AS f (run_id, seq, event, data) "
    "ON f.run_id = run.run_id "
    "ON CONFLICT (run, seq) DO UPDATE SET event = EXCLUDED.event, data = EXCLUDED.data), "
    "notice AS (SELECT n.run_id, (SELECT count(*) FROM (SELECT pg_notify(n.channel, "
    "n.last || ' ' || n.run_id) WHERE run.followers > 0) AS sent) AS sent FROM run JOIN "
    "unnest($5::text[], $6::text[], $7::text[]) AS n (run_id, channel, last) "
    "ON n.run_id = run.run_id) "
    "SELECT run_id, sent FROM notice"
)
"""`PostgresRunStore.append_feeds`: `$1`-`$4` every frame's run id, seq, event and data;
`$5`-`$7` each run's id, notice channel and last seq; `$8` the owner. Returns the runs written
(and whether a notice went: only for a run some replica follows)."""


def _seqs(frames: Sequence[tuple[int, str, str]]) -> list[str]:
    """Frame numbers as text, cast back in SQL: asyncpg knows `text[]` without asking the
    server, while an `integer[]` parameter costs each new pool connection three extra round
    trips (its type introspection) the first time it is sent."""
    return [str(entry[0]) for entry in frames]


def _described(run: StoredRun) -> tuple[Any, ...]:
    """A new run row's `path` to `started_at` columns, in `INSERT` order."""
    return (
        run.path,
        run.conversation_id,
        run.user_id or "",
        run.session_id,
        run.message,
        run.started_at,
    )


def _stored(row: Any) -> StoredRun:
    return StoredRun(
        run_id=row["run_id"],
        path=row["path"],
        conversation_id=row["conversation_id"],
        user_id=row["user_key"] or None,
        session_id=row["session_id"],
        message=row["message"],
        started_at=float(row["started_at"]),
    )


class PostgresRunStore:
    """A `contracts.RunStore` on the shared PostgreSQL database (see the module docstring).

    The database is the backend's resource (opened by the host before the journal), so `open`
    and `aclose` have nothing of their own to do.
    """

    name = "postgres"

    def __init__(self, database: PostgresDatabase) -> None:
        self.database = database
        self._dropped_upto: float | None = None
        """Where the last `expire` stopped dropping frames (a finish time)."""
        self._watchers = RunWatchers(self._subscribe, self._unsubscribe)
        database.on_reconnect(self._watchers.resubscribed)

    def __repr__(self) -> str:
        return f"PostgresRunStore({self.database!r})"

    async def open(self) -> None:
        """Nothing to open: the shared `PostgresDatabase` is (it migrates the tables)."""

    async def aclose(self) -> None:
        """Nothing to close: the shared `PostgresDatabase` closes with the other resources."""

    async def append(
        self,
        run_id: str,
        frames: Sequence[tuple[int, str, str]],
        checkpoints: Sequence[tuple[str, str]],
        *,
        create: StoredRun | None = None,
        owner: str | None = None,
        lease_seconds: float = 0.0,
    ) -> None:
        if owner is not None and owner.startswith(FEED_OWNER):
            if checkpoints:
                raise ValueError("a frame-feed run journals frames only, no checkpoints")
            await self._append_feed(run_id, frames, create, owner, lease_seconds)
            return

        async def work(connection: Any) -> None:
            async with connection.transaction():
                if create is not None:
                    row = await connection.fetchval(
                        "INSERT INTO atmosphere_runs (run_id, path, conversation_id, user_key, "
                        "session_id, message, started_at, owner, lease_until) "
                        f"VALUES ($1, $2, $3, $4, $5, $6, $7, $8, {NOW} + $9) "
                        # A retry (the first attempt's commit reply was lost) finds its row.
                        "ON CONFLICT (run_id) DO UPDATE SET run_id = EXCLUDED.run_id "
                        "RETURNING id",
                        create.run_id,
                        *_described(create),
                        owner,
                        lease_seconds,
                    )
                else:
                    # Locks the row: a concurrent claim skips it, a committed one is seen here.
                    found = await connection.fetchrow(
                        "SELECT id, owner FROM atmosphere_runs WHERE run_id = $1 FOR NO KEY UPDATE",
                        run_id,
                    )
                    if found is None:
                        raise LookupError(f"durable run {run_id} is not in the store")
                    if owner is not None and found["owner"] != owner:
                        raise LeaseLost(
                            f"durable run {run_id} was taken over by {found['owner']}: "
                            f"{owner} no longer writes its journal"
                        )
                    row = found["id"]
                if frames:
                    await connection.execute(
                        "WITH "
                        + notice(6, "SELECT followers FROM atmosphere_runs WHERE id = $5")
                        + " "
                        "INSERT INTO atmosphere_run_frames (run, seq, event, data) "
                        "SELECT $5, f.seq::integer, f.event, f.data FROM notice, "
                        "unnest($2::text[], $3::text[], $4::text[]) AS f (seq, event, data) "
                        "ON CONFLICT (run, seq) DO UPDATE "
                        "SET event = EXCLUDED.event, data = EXCLUDED.data",
                        run_id,
                        _seqs(frames),
                        [entry[1] for entry in frames],
                        [entry[2] for entry in frames],
                        row,
                        channel(run_id),
                    )
                if checkpoints:
                    latest = dict(checkpoints)  # one statement may not set a key twice
                    await connection.execute(
                        "INSERT INTO atmosphere_run_checkpoints (run, key, value) "
                        "SELECT $1, * FROM unnest($2::text[], $3::text[]) "
                        "ON CONFLICT (run, key) DO UPDATE SET value = EXCLUDED.value",
                        row,
                        list(latest),
                        list(latest.values()),
                    )

        await self.database.run(work)

    async def _append_feed(
        self,
        run_id: str,
        frames: Sequence[tuple[int, str, str]],
        create: StoredRun | None,
        owner: str,
        lease_seconds: float,
    ) -> None:
        """A frame-feed write: one statement, one round trip (an implicit transaction), that
        commits without waiting for the WAL flush (`set_config(..., is_local)` lasts until that
        commit: the feed is not a durability promise). Without `create`, it writes only while
        the run is this owner's and unfinished (`abandon` may have ended it). A terminal last
        frame finishes the run in the same statement (the feed's end needs no `finish`)."""
        seqs = _seqs(frames)
        names = [entry[1] for entry in frames]
        data = [entry[2] for entry in frames]
        finished = time.time() if frames and frames[-1][1] in TERMINAL else None
        if create is not None:
            run = (
                "INSERT INTO atmosphere_runs (run_id, path, conversation_id, user_key, "
                "session_id, message, started_at, owner, lease_until, finished_at) "
                f"SELECT $1, $6, $7, $8, $9, $10, $11, $12, {NOW} + $13, $14 FROM relaxed "
                # A retry (the first attempt's commit reply was lost) finds its row.
                "ON CONFLICT (run_id) DO UPDATE SET run_id = EXCLUDED.run_id "
                "RETURNING id, followers"
            )
            args: tuple[Any, ...] = (*_described(create), owner, lease_seconds, finished)
        elif finished is not None:
            run = (
                "UPDATE atmosphere_runs SET finished_at = $7, message = '' FROM relaxed "
                "WHERE run_id = $1 AND owner = $6 AND finished_at IS NULL "
                "RETURNING atmosphere_runs.id, atmosphere_runs.followers"
            )
            args = (owner, finished)
        else:
            run = (
                "SELECT id, followers FROM atmosphere_runs, relaxed WHERE run_id = $1 "
                "AND owner = $6 AND finished_at IS NULL FOR NO KEY UPDATE OF atmosphere_runs"
            )
            args = (owner,)
        statement = (
            "WITH relaxed AS (SELECT set_config('synchronous_commit', 'off', true)), "
            f"run AS ({run}), {notice(5, 'SELECT followers FROM run')} "
            "INSERT INTO atmosphere_run_frames (run, seq, event, data) "
            "SELECT run.id, f.seq::integer, f.event, f.data FROM run, notice, "
            "unnest($2::text[], $3::text[], $4::text[]) AS f (seq, event, data) "
            "ON CONFLICT (run, seq) DO UPDATE SET event = EXCLUDED.event, data = EXCLUDED.data"
        )

        async def work(connection: Any) -> str:
            return str(
                await connection.execute(
                    statement, run_id, seqs, names, data, channel(run_id), *args
                )
            )

        status = await self.database.run(work)
        if create is None and frames and status.rsplit(" ", 1)[-1] == "0":
            await self._refused(run_id, owner)

    async def append_feeds(
        self, owner: str, runs: Sequence[tuple[str, Sequence[tuple[int, str, str]]]]
    ) -> dict[str, str]:
        """`kernel.feed.FeedBatches`: frames of several frame-feed runs in one statement, as
        `_append_feed` writes one run's (no WAL flush wait, each run's notice on its channel),
        written only for the runs still `owner`'s and unfinished. Their rows are locked in id
        order, as `heartbeat` locks them, so the two never deadlock."""
        frame_runs: list[str] = []
        seqs: list[str] = []
        names: list[str] = []
        data: list[str] = []
        run_ids: list[str] = []
        channels: list[str] = []
        lasts: list[str] = []
        for run_id, frames in runs:
            if not frames:
                continue
            run_ids.append(run_id)
            channels.append(channel(run_id))
            lasts.append(str(frames[-1][0]))
            for seq, event, payload in frames:
                frame_runs.append(run_id)
                seqs.append(str(seq))
                names.append(event)
                data.append(payload)
        if not run_ids:
            return {}

        async def work(connection: Any) -> list[Any]:
            rows: list[Any] = await connection.fetch(
                APPEND_FEEDS, frame_runs, seqs, names, data, run_ids, channels, lasts, owner
            )
            return rows

        written = {row[0] for row in await self.database.run(work)}
        refused = [run_id for run_id in run_ids if run_id not in written]
        if not refused:
            return {}

        async def known(connection: Any) -> list[Any]:
            rows: list[Any] = await connection.fetch(
                "SELECT run_id FROM atmosphere_runs WHERE run_id = ANY($1::text[])", refused
            )
            return rows

        found = {row[0] for row in await self.database.run(known)}
        return {run_id: "ended" if run_id in found else "missing" for run_id in refused}

    async def _refused(self, run_id: str, owner: str) -> None:
        """Why a frame-feed write wrote nothing: the run is gone, another's, or ended."""

        async def work(connection: Any) -> Any:
            return await connection.fetchrow(
                "SELECT owner, finished_at FROM atmosphere_runs WHERE run_id = $1", run_id
            )

        found = await self.database.run(work)
        if found is None:
            raise LookupError(f"shared run {run_id} is not in the store")
        raise LeaseLost(f"shared run {run_id} was ended or taken: {owner} no longer writes it")

    async def load(self, run_id: str, limit: int) -> tuple[dict[str, Any], list[Frame]]:
        async def work(connection: Any) -> tuple[Any, list[Any], list[Any]]:
            async with connection.transaction(isolation="repeatable_read", readonly=True):
                run = await connection.fetchrow(
                    "SELECT id, session_id, conversation_id FROM atmosphere_runs WHERE run_id = $1",
                    run_id,
                )
                if run is None:
                    return None, [], []
                checkpoints = await connection.fetch(
                    "SELECT key, value FROM atmosphere_run_checkpoints WHERE run = $1", run["id"]
                )
                frames = await connection.fetch(
                    "SELECT seq, event, data FROM atmosphere_run_frames WHERE run = $1 "
                    "ORDER BY seq DESC LIMIT $2",
                    run["id"],
                    limit,
                )
                return run, checkpoints, frames

        run, checkpoints, frames = await self.database.run(work)
        if run is None:
            return {}, []
        return (
            {row["key"]: json.loads(row["value"]) for row in checkpoints},
            [
                Frame(
                    row["event"],
                    json.loads(row["data"]),
                    run["session_id"],
                    run["conversation_id"],
                    int(row["seq"]),
                )
                for row in reversed(frames)
            ],
        )

    async def claim(self, owner: str, lease_seconds: float, limit: int) -> list[StoredRun]:
        async def work(connection: Any) -> list[Any]:
            return list(
                await connection.fetch(
                    f"UPDATE atmosphere_runs SET owner = $1, lease_until = {NOW} + $2 "
                    "WHERE id IN (SELECT id FROM atmosphere_runs WHERE finished_at IS NULL "
                    f"AND lease_until < {NOW} AND owner IS DISTINCT FROM $1 "
                    "AND (owner IS NULL OR NOT starts_with(owner, $4)) "
                    "ORDER BY started_at LIMIT $3 FOR UPDATE SKIP LOCKED) "
                    f"RETURNING {RUN_COLUMNS}",
                    owner,
                    lease_seconds,
                    limit,
                    FEED_OWNER,
                )
            )

        rows = await self.database.run(work)
        return [_stored(row) for row in sorted(rows, key=lambda row: row["started_at"])]

    async def heartbeat(self, owner: str, lease_seconds: float) -> None:
        async def work(connection: Any) -> None:
            # The rows are locked in id order, as a batch of frame-feed writes locks them
            # (`append_feeds`): two statements locking many rows never wait on each other.
            await connection.execute(
                f"UPDATE atmosphere_runs SET lease_until = {NOW} + $2 WHERE id IN ("
                "SELECT id FROM atmosphere_runs WHERE owner = $1 AND finished_at IS NULL "
                "ORDER BY id FOR NO KEY UPDATE)",
                owner,
                lease_seconds,
            )

        await self.database.run(work)

    async def release(self, owner: str) -> None:
        async def work(connection: Any) -> None:
            await connection.execute(
                "UPDATE atmosphere_runs SET lease_until = 0 "
                "WHERE owner = $1 AND finished_at IS NULL",
                owner,
            )

        await self.database.run(work)

    async def finish(self, run_id: str) -> None:
        """Mark the run finished; its frames and checkpoints go in `expire`, once
        `FOLLOW_GRACE_SECONDS` have passed (readers on other replicas catch up meanwhile)."""
        now = time.time()

        async def work(connection: Any) -> None:
            # A frame-feed run's end is no durability promise either: no wait for the flush.
            await connection.execute(
                "UPDATE atmosphere_runs SET finished_at = $2, message = '' WHERE run_id = $1 "
                "RETURNING set_config('synchronous_commit', CASE WHEN starts_with(owner, $3) "
                "THEN 'off' ELSE current_setting('synchronous_commit') END, true)",
                run_id,
                now,
                FEED_OWNER,
            )

        await self.database.run(work)

    async def forget(self, path: str, conversation_id: str) -> None:
        """Drop the conversation's finished runs (their frames and checkpoints cascade)."""

        async def work(connection: Any) -> None:
            await connection.execute(
                "DELETE FROM atmosphere_runs WHERE path = $1 AND conversation_id = $2 "
                "AND finished_at IS NOT NULL",
                path,
                conversation_id,
            )

        await self.database.run(work)

    async def expire(self, before: float) -> int:
        """Drop the frames and checkpoints of the runs that finished since the last call (and
        `FOLLOW_GRACE_SECONDS` ago), and the rows of those that finished before `before`.

        Each call reads only the runs that finished since the previous one (give or take
        `DROP_SLACK_SECONDS`), never every kept run: its cost follows the rate of runs, not
        how many are kept. The `= ANY(ARRAY(...))` form keeps the frames' primary key in use
        whatever PostgreSQL estimates (a generic plan would otherwise scan every frame)."""
        grace = time.time() - FOLLOW_GRACE_SECONDS
        since = self._dropped_upto if self._dropped_upto is not None else grace
        since = min(since, grace) - DROP_SLACK_SECONDS

        async def work(connection: Any) -> int:
            for table in ("atmosphere_run_frames", "atmosphere_run_checkpoints"):
                await connection.execute(
                    f"DELETE FROM {table} WHERE run = ANY(ARRAY(SELECT id FROM atmosphere_runs "
                    "WHERE finished_at >= $2 AND finished_at < $1))",
                    grace,
                    since,
                )
            status = await connection.execute(
                "DELETE FROM atmosphere_runs WHERE finished_at IS NOT NULL AND finished_at < $1",
                before,
            )
            return int(str(status).rsplit(" ", 1)[-1])

        dropped = await self.database.run(work)
        self._dropped_upto = grace
        return dropped

    # --- contracts.RunFeed: following a run another replica executes ----------------------

    async def latest(
        self, path: str, conversation_id: str, *, session_id: str | None = None
    ) -> tuple[StoredRun, bool] | None:
        async def work(connection: Any) -> Any:
            # The one `session_id` names, else the oldest unfinished, else the newest.
            return await connection.fetchrow(
                f"SELECT {RUN_COLUMNS}, finished_at IS NOT NULL AS finished "
                "FROM atmosphere_runs WHERE path = $1 AND conversation_id = $2 "
                "AND ($3::text IS NULL OR session_id = $3) "
                "ORDER BY finished_at IS NOT NULL, "
                "CASE WHEN finished_at IS NULL THEN started_at ELSE -started_at END "
                "LIMIT 1",
                path,
                conversation_id,
                session_id,
            )

        row = await self.database.run(work)
        if row is None:
            if session_id is not None:
                return await self.latest(path, conversation_id)
            return None
        return _stored(row), bool(row["finished"])

    async def frames_after(self, run_id: str, after: int, limit: int) -> tuple[list[Frame], bool]:
        """One statement (one round trip, one snapshot): the run's row joined with its frames
        after `after`; a run without such frames is one row whose frame columns are null."""

        async def work(connection: Any) -> list[Any]:
            return list(
                await connection.fetch(
                    "SELECT r.session_id, r.conversation_id, r.finished_at IS NOT NULL AS "
                    "finished, f.seq, f.event, f.data FROM atmosphere_runs AS r "
                    "LEFT JOIN LATERAL (SELECT seq, event, data FROM atmosphere_run_frames "
                    "WHERE run = r.id AND seq > $2 ORDER BY seq LIMIT $3) AS f ON true "
                    "WHERE r.run_id = $1 ORDER BY f.seq",
                    run_id,
                    after,
                    limit,
                )
            )

        rows = await self.database.run(work)
        if not rows:
            return [], True  # expired: nothing more will come
        frames = [
            Frame(
                row["event"],
                json.loads(row["data"]),
                row["session_id"],
                row["conversation_id"],
                int(row["seq"]),
            )
            for row in rows
            if row["seq"] is not None
        ]
        return frames, bool(rows[0]["finished"])

    def watch(self, run_id: str, wake: Callable[[int], None]) -> Callable[[], None]:
        """Wake a reader of `run_id` when any replica stored new frames of it (`NOTIFY` on the
        run's channel, which this replica `LISTEN`s to while it has a reader of the run)."""
        return self._watchers.watch(run_id, wake)

    async def _subscribe(self, runs: list[str]) -> None:
        """`LISTEN` on each run's channel, then count this replica among the run's followers
        (`followers`, which its writes' notices wait for), then wake its readers to read once
        more. The count takes the run's row lock, as a write does: a write that locked it
        first is committed before the readers' read; one that comes later sees the count."""
        for run_id in runs:
            if await self.database.subscribe(channel(run_id), self._watchers.notified):
                await self._follow(run_id, 1)
                self._watchers.subscribed_to(run_id)

    async def _unsubscribe(self, runs: list[str]) -> None:
        for run_id in runs:
            await self.database.unsubscribe(channel(run_id), self._watchers.notified)
            await self._follow(run_id, -1)

    async def _follow(self, run_id: str, change: int) -> None:
        """Count this replica in (`1`) or out (`-1`) of the run's followers. A failure costs
        its readers the notices (they poll), or the run notices nobody hears (a count left
        too high, as when a follower's replica dies: only until the run ends)."""

        async def work(connection: Any) -> None:
            await connection.execute(
                "UPDATE atmosphere_runs SET followers = greatest(followers + $2, 0) "
                "WHERE run_id = $1",
                run_id,
                change,
            )

        try:
            await self.database.run(work)
        except Exception as exc:
            fault(log, "could not count a run's follower", exc, every=False, run=run_id)

    async def ask(self, path: str, conversation_id: str, session_id: str | None) -> None:
        async def work(connection: Any) -> None:
            await connection.execute(
                "SELECT pg_notify($1, $2)",
                ASK_CHANNEL,
                ask_payload(path, conversation_id, session_id),
            )

        await self.database.run(work)

    async def hear_asks(self, on_ask: AskListener) -> None:
        await self.database.subscribe(ASK_CHANNEL, lambda payload: deliver_ask(payload, on_ask))

    async def abandon(self, message: str, limit: int) -> int:
        """End the frame-feed runs whose replica died: a terminal `error` frame after the last
        stored one, and `finished_at` (their frames go after the grace period, as any run's)."""
        data = json.dumps({"message": message, "type": "ServerLost"}, separators=(",", ":"))
        now = time.time()

        async def work(connection: Any) -> int:
            # Row locks order this after a concurrent append (it holds `FOR NO KEY UPDATE`);
            # an append that comes later finds the run finished and stops (`LeaseLost`).
            status = await connection.execute(
                "WITH dead AS (SELECT id FROM atmosphere_runs WHERE finished_at IS NULL "
                f"AND lease_until < {NOW} AND starts_with(owner, $1) "
                "ORDER BY lease_until LIMIT $2 FOR UPDATE SKIP LOCKED), "
                "ended AS (UPDATE atmosphere_runs SET finished_at = $3 "
                "WHERE id IN (SELECT id FROM dead) RETURNING id) "
                "INSERT INTO atmosphere_run_frames (run, seq, event, data) "
                "SELECT ended.id, coalesce((SELECT max(seq) FROM atmosphere_run_frames f "
                "WHERE f.run = ended.id), 0) + 1, 'error', $4 FROM ended",
                FEED_OWNER,
                limit,
                now,
                data,
            )
            return int(str(status).rsplit(" ", 1)[-1])

        return await self.database.run(work)
