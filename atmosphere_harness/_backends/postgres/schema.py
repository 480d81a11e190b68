"""The PostgreSQL schema, as numbered migrations the library applies itself at start-up.

`migrate(connection)` runs inside one transaction that first takes a transaction-level advisory
lock, so two replicas starting at once apply each migration exactly once: the second waits for
the first to commit, then finds the version already recorded and does nothing. A database whose
recorded version is newer than this library's is refused (an older replica must not run against
tables it does not know).
"""

from __future__ import annotations

from typing import Any

from ..._errors import SchemaTooNew

MIGRATION_LOCK = 0x61746D6F73  # "atmos": the advisory lock every replica takes to migrate

MIGRATIONS: tuple[str, ...] = (
    # 1: every table of the state backend.
    """
    CREATE TABLE atmosphere_meta (
        key text PRIMARY KEY,
        value text NOT NULL
    );
    INSERT INTO atmosphere_meta (key, value)
        VALUES ('epoch', substr(md5(random()::text || clock_timestamp()::text), 1, 8));

    CREATE TABLE atmosphere_conversations (
        id bigserial PRIMARY KEY,
        endpoint text NOT NULL,
        user_key text NOT NULL,
        conversation_id text NOT NULL,
        updated_at double precision NOT NULL,
        closed_at double precision,
        last_seq integer NOT NULL DEFAULT 0,
        extracted_seq integer NOT NULL DEFAULT 0,
        summary text,
        summary_covered integer NOT NULL DEFAULT 0,
        summary_seq integer NOT NULL DEFAULT 0,
        UNIQUE (endpoint, user_key, conversation_id)
    );
    CREATE INDEX atmosphere_conversations_open
        ON atmosphere_conversations (updated_at) WHERE closed_at IS NULL;
    CREATE TABLE atmosphere_messages (
        conversation bigint NOT NULL REFERENCES atmosphere_conversations (id) ON DELETE CASCADE,
        seq integer NOT NULL,
        payload bytea NOT NULL,
        PRIMARY KEY (conversation, seq)
    );

    CREATE TABLE atmosphere_facts (
        id bigserial PRIMARY KEY,
        user_id text NOT NULL,
        fact text NOT NULL,
        norm text NOT NULL,
        created_at double precision NOT NULL,
        search tsvector GENERATED ALWAYS AS (to_tsvector('simple', fact)) STORED,
        UNIQUE (user_id, norm)
    );
    CREATE INDEX atmosphere_facts_user ON atmosphere_facts (user_id, id);
    CREATE INDEX atmosphere_facts_search ON atmosphere_facts USING gin (search);

    CREATE TABLE atmosphere_plans (
        owner text NOT NULL,
        agent_id text NOT NULL,
        conversation_id text NOT NULL,
        plan text NOT NULL,
        updated_at double precision NOT NULL,
        PRIMARY KEY (owner, agent_id, conversation_id)
    );
    CREATE INDEX atmosphere_plans_age ON atmosphere_plans (owner, updated_at);

    CREATE TABLE atmosphere_plan_events (
        id bigserial PRIMARY KEY,
        owner text NOT NULL,
        conversation_id text NOT NULL,
        data text NOT NULL,
        created_at double precision NOT NULL
    );
    CREATE INDEX atmosphere_plan_events_topic
        ON atmosphere_plan_events (owner, conversation_id, id);
    CREATE INDEX atmosphere_plan_events_age ON atmosphere_plan_events (created_at);
    CREATE TABLE atmosphere_plan_topics (
        owner text NOT NULL,
        conversation_id text NOT NULL,
        pruned_upto bigint NOT NULL,
        PRIMARY KEY (owner, conversation_id)
    );

    CREATE TABLE atmosphere_approvals (
        id text PRIMARY KEY,
        path text NOT NULL,
        conversation_id text NOT NULL,
        user_id text,
        tool text NOT NULL,
        tool_call_id text NOT NULL,
        arguments text NOT NULL,
        expires_at double precision NOT NULL,
        answer text,
        closed boolean NOT NULL DEFAULT false
    );
    CREATE INDEX atmosphere_approvals_open
        ON atmosphere_approvals (path, conversation_id) WHERE NOT closed;
    CREATE INDEX atmosphere_approvals_age ON atmosphere_approvals (expires_at);
    """,
    # 2: conversation workspaces as rows (`PostgresAgentFileSystem`).
    """
    CREATE TABLE atmosphere_files (
        store text NOT NULL,
        path text NOT NULL,
        content bytea NOT NULL,
        size integer NOT NULL,
        updated_at double precision NOT NULL,
        PRIMARY KEY (store, path)
    );
    """,
    # 3: durable runs (`PostgresRunStore`): one row per run, its frames and its checkpoints.
    """
    CREATE TABLE atmosphere_runs (
        id bigserial PRIMARY KEY,
        run_id text NOT NULL UNIQUE,
        path text NOT NULL,
        conversation_id text NOT NULL,
        user_key text NOT NULL,
        session_id text NOT NULL,
        message text NOT NULL,
        started_at double precision NOT NULL,
        owner text,
        lease_until double precision NOT NULL DEFAULT 0,
        finished_at double precision
    );
    CREATE INDEX atmosphere_runs_unfinished
        ON atmosphere_runs (lease_until) WHERE finished_at IS NULL;
    CREATE INDEX atmosphere_runs_conversation
        ON atmosphere_runs (path, conversation_id, started_at);
    CREATE INDEX atmosphere_runs_finished
        ON atmosphere_runs (finished_at) WHERE finished_at IS NOT NULL;
    CREATE TABLE atmosphere_run_frames (
        run bigint NOT NULL REFERENCES atmosphere_runs (id) ON DELETE CASCADE,
        seq integer NOT NULL,
        event text NOT NULL,
        data text NOT NULL,
        PRIMARY KEY (run, seq)
    );
    CREATE TABLE atmosphere_run_checkpoints (
        run bigint NOT NULL REFERENCES atmosphere_runs (id) ON DELETE CASCADE,
        key text NOT NULL,
        value text NOT NULL,
        PRIMARY KEY (run, key)
    );
    """,
    # 4: one replica extracts a conversation closed on several at once (a claim with a deadline).
    """
    ALTER TABLE atmosphere_conversations ADD COLUMN extracting_until double precision;
    """,
    # 5: take a conversation's lock and read its newest history in one round trip
    # (`locks.PostgresConversationLocks`). PL/pgSQL, VOLATILE: in READ COMMITTED, its
    # `RETURN QUERY` takes a fresh snapshot after `pg_try_advisory_lock` returned, so the read
    # sees every turn committed before the lock was taken (a plain `SELECT` of both would read
    # with a snapshot taken before the lock). One row `locked = false` when another session
    # holds the lock; else at least one row (`seq` NULL: no message), as `history.NEWEST`.
    """
    CREATE FUNCTION atmosphere_lock_newest(
        lock_key bigint, p_endpoint text, p_user_key text, p_conversation text,
        after_seq integer, max_rows integer
    ) RETURNS TABLE (locked boolean, summary text, summary_covered integer, seq integer,
                     payload bytea)
    LANGUAGE plpgsql VOLATILE AS $$
    #variable_conflict use_column
    BEGIN
        IF NOT pg_try_advisory_lock(lock_key) THEN
            RETURN QUERY SELECT false, NULL::text, NULL::integer, NULL::integer, NULL::bytea;
            RETURN;
        END IF;
        RETURN QUERY
        SELECT true, c.summary, c.summary_covered, m.seq, m.payload
        FROM (SELECT 1) AS one
        LEFT JOIN atmosphere_conversations AS c
            ON c.endpoint = p_endpoint AND c.user_key = p_user_key
            AND c.conversation_id = p_conversation
        LEFT JOIN LATERAL (
            SELECT seq, payload FROM atmosphere_messages
            WHERE conversation = c.id AND seq > coalesce(after_seq, c.summary_seq)
            ORDER BY seq DESC LIMIT max_rows
        ) AS m ON true
        ORDER BY m.seq DESC;
    END
    $$;
    """,
    # 6: writes survive a lost acknowledgement. A retried history append carries the key of its
    # first attempt (`last_write`: the append is skipped when the row already holds it); a
    # workspace change records its key and its answer (`atmosphere_file_changes`, kept a few
    # minutes); a prompt's `Idempotency-Key` names the run it started (`atmosphere_prompt_keys`).
    """
    ALTER TABLE atmosphere_conversations ADD COLUMN last_write text;
    CREATE TABLE atmosphere_file_changes (
        store text NOT NULL,
        key text NOT NULL,
        result text NOT NULL,
        at double precision NOT NULL,
        PRIMARY KEY (store, key)
    );
    CREATE TABLE atmosphere_prompt_keys (
        scope text PRIMARY KEY,
        record text NOT NULL,
        expires_at double precision NOT NULL
    );
    CREATE INDEX atmosphere_prompt_keys_age ON atmosphere_prompt_keys (expires_at);
    """,
    # 7: run control (`PostgresRunRegistry`): every run's status, usage, error and cancel request.
    """
    CREATE TABLE atmosphere_run_control (
        run_id text PRIMARY KEY,
        path text NOT NULL,
        conversation_id text NOT NULL,
        user_key text NOT NULL,
        has_user boolean NOT NULL,
        status text NOT NULL,
        usage text,
        error text,
        cancel text,
        owner text NOT NULL,
        lease_until double precision NOT NULL,
        started_at double precision NOT NULL,
        updated_at double precision NOT NULL
    );
    CREATE INDEX atmosphere_run_control_active
        ON atmosphere_run_control (path, conversation_id)
        WHERE status IN ('queued', 'running', 'waiting-approval');
    CREATE INDEX atmosphere_run_control_updated ON atmosphere_run_control (updated_at);
    """,
    # 8: each user's tokens per UTC day (`PostgresUserTokens`, the daily token cap).
    """
    CREATE TABLE atmosphere_user_tokens (
        user_id text NOT NULL,
        day text NOT NULL,
        tokens bigint NOT NULL,
        PRIMARY KEY (user_id, day)
    );
    """,
    # 9: who owns each conversation (`owners.PostgresConversationOwners`): the user whose prompt
    # first used the id, for every replica.
    """
    CREATE TABLE atmosphere_conversation_owners (
        path text NOT NULL,
        conversation_id text NOT NULL,
        user_key text NOT NULL,
        claimed_at double precision NOT NULL,
        PRIMARY KEY (path, conversation_id)
    );
    """,
    # 10: a user's conversations, newest first (`owners.PostgresConversationOwners.page`): the
    # time of each conversation's last prompt and the first prompt's title.
    """
    ALTER TABLE atmosphere_conversation_owners
        ADD COLUMN updated_at double precision NOT NULL DEFAULT 0,
        ADD COLUMN title text NOT NULL DEFAULT '';
    UPDATE atmosphere_conversation_owners SET updated_at = claimed_at;
    CREATE INDEX atmosphere_conversation_owners_by_user
        ON atmosphere_conversation_owners (path, user_key, updated_at DESC, conversation_id DESC);
    """,
    # 11: `atmosphere_lock_newest` that also stores the run's status (`locks.LOCK_RUN`): the
    # run's `atmosphere_run_control` row says `running` once the lock is taken, or `queued`
    # when `r_queue` and the lock is another run's; a status other than these two is never
    # replaced (a run cancelled meanwhile). The row is committed without waiting for the WAL
    # flush, like every run status write (`control.UPSERT`).
    """
    CREATE FUNCTION atmosphere_lock_run(
        lock_key bigint, p_endpoint text, p_user_key text, p_conversation text,
        after_seq integer, max_rows integer,
        r_id text, r_path text, r_conversation text, r_user_key text, r_has_user boolean,
        r_owner text, r_lease double precision, r_started double precision,
        r_updated double precision, r_queue boolean
    ) RETURNS TABLE (locked boolean, summary text, summary_covered integer, seq integer,
                     payload bytea)
    LANGUAGE plpgsql VOLATILE AS $$
    #variable_conflict use_column
    DECLARE
        got boolean := pg_try_advisory_lock(lock_key);
    BEGIN
        IF got OR r_queue THEN
            PERFORM set_config('synchronous_commit', 'off', true);
            INSERT INTO atmosphere_run_control AS r (run_id, path, conversation_id, user_key,
                has_user, status, owner, lease_until, started_at, updated_at)
            VALUES (r_id, r_path, r_conversation, r_user_key, r_has_user,
                CASE WHEN got THEN 'running' ELSE 'queued' END, r_owner, r_lease, r_started,
                r_updated)
            ON CONFLICT (run_id) DO UPDATE SET status = EXCLUDED.status,
                owner = EXCLUDED.owner, lease_until = EXCLUDED.lease_until,
                updated_at = EXCLUDED.updated_at
            WHERE r.status IN ('queued', 'running');
        END IF;
        IF NOT got THEN
            RETURN QUERY SELECT false, NULL::text, NULL::integer, NULL::integer, NULL::bytea;
            RETURN;
        END IF;
        RETURN QUERY
        SELECT true, c.summary, c.summary_covered, m.seq, m.payload
        FROM (SELECT 1) AS one
        LEFT JOIN atmosphere_conversations AS c
            ON c.endpoint = p_endpoint AND c.user_key = p_user_key
            AND c.conversation_id = p_conversation
        LEFT JOIN LATERAL (
            SELECT seq, payload FROM atmosphere_messages
            WHERE conversation = c.id AND seq > coalesce(after_seq, c.summary_seq)
            ORDER BY seq DESC LIMIT max_rows
        ) AS m ON true
        ORDER BY m.seq DESC;
    END
    $$;
    """,
    # 12: deleting a conversation (`kernel.forget`) finds each of its rows by an index: its
    # runs' records, its approvals, its plans and its prompts' `Idempotency-Key`s (which now
    # name it);
    # retention (`conversation_ttl`) finds idle conversations by their last prompt and claims
    # each for one replica (`sweep_until`).
    """
    CREATE INDEX atmosphere_run_control_conversation
        ON atmosphere_run_control (path, conversation_id);
    CREATE INDEX atmosphere_approvals_conversation
        ON atmosphere_approvals (path, conversation_id);
    CREATE INDEX atmosphere_plans_conversation ON atmosphere_plans (owner, conversation_id);
    ALTER TABLE atmosphere_prompt_keys
        ADD COLUMN path text NOT NULL DEFAULT '',
        ADD COLUMN conversation_id text NOT NULL DEFAULT '';
    CREATE INDEX atmosphere_prompt_keys_conversation
        ON atmosphere_prompt_keys (path, conversation_id);
    ALTER TABLE atmosphere_conversation_owners ADD COLUMN sweep_until double precision;
    CREATE INDEX atmosphere_conversation_owners_idle
        ON atmosphere_conversation_owners (updated_at);
    """,
    # 13: the daily token cap reserves before each model call: each user's last call, the
    # floor of the next reservation (`PostgresUserTokens.reserve`).
    """
    ALTER TABLE atmosphere_user_tokens ADD COLUMN last_call bigint NOT NULL DEFAULT 0;
    """,
    # 14: a derived conversation (a fleet member's) names the conversation it was derived from,
    # which deletes it with itself (`owners.PostgresConversationOwners.children`); retention
    # never picks it on its own.
    """
    ALTER TABLE atmosphere_conversation_owners
        ADD COLUMN parent_path text,
        ADD COLUMN parent_id text;
    CREATE INDEX atmosphere_conversation_owners_by_parent
        ON atmosphere_conversation_owners (parent_path, parent_id)
        WHERE parent_id IS NOT NULL;
    """,
    # 15: `atmosphere_lock_run` that also claims the conversation for the prompt's user
    # (`locks.CLAIM_LOCK_RUN`, `contracts.LockedClaim`): the owner row is claimed first (as
    # `owners.CLAIM` does); a conversation another user owns answers its owner and nothing
    # else happens (no lock, no status, no read). With `try_lock` false the statement only
    # claims and stores `queued` (a prompt whose replica already runs one of the conversation).
    # Everything commits without waiting for the WAL flush: a stored turn, which waits for
    # its own flush, makes the claim before it durable too (the WAL is flushed in order).
    """
    CREATE FUNCTION atmosphere_claim_lock_run(
        lock_key bigint, try_lock boolean,
        c_path text, c_conversation text, c_user text, c_now double precision, c_title text,
        p_endpoint text, p_user_key text, p_conversation text,
        after_seq integer, max_rows integer,
        r_id text, r_path text, r_conversation text, r_user_key text, r_has_user boolean,
        r_owner text, r_lease double precision, r_started double precision,
        r_updated double precision, r_queue boolean
    ) RETURNS TABLE (owner_key text, locked boolean, summary text, summary_covered integer,
                     seq integer, payload bytea)
    LANGUAGE plpgsql VOLATILE AS $$
    #variable_conflict use_column
    DECLARE
        found_owner text;
        got boolean := false;
    BEGIN
        PERFORM set_config('synchronous_commit', 'off', true);
        FOR attempt IN 1..3 LOOP
            INSERT INTO atmosphere_conversation_owners AS o
                (path, conversation_id, user_key, claimed_at, updated_at, title)
            VALUES (c_path, c_conversation, c_user, c_now, c_now, c_title)
            ON CONFLICT (path, conversation_id) DO UPDATE SET updated_at = EXCLUDED.updated_at
                WHERE o.user_key = EXCLUDED.user_key
            RETURNING o.user_key INTO found_owner;
            IF found_owner IS NULL THEN
                SELECT o.user_key INTO found_owner FROM atmosphere_conversation_owners AS o
                WHERE o.path = c_path AND o.conversation_id = c_conversation;
            END IF;
            EXIT WHEN found_owner IS NOT NULL;
        END LOOP;
        IF found_owner IS DISTINCT FROM c_user THEN
            RETURN QUERY SELECT found_owner, false, NULL::text, NULL::integer, NULL::integer,
                NULL::bytea;
            RETURN;
        END IF;
        IF try_lock THEN
            got := pg_try_advisory_lock(lock_key);
        END IF;
        IF r_id IS NOT NULL AND (got OR r_queue) THEN
            INSERT INTO atmosphere_run_control AS r (run_id, path, conversation_id, user_key,
                has_user, status, owner, lease_until, started_at, updated_at)
            VALUES (r_id, r_path, r_conversation, r_user_key, r_has_user,
                CASE WHEN got THEN 'running' ELSE 'queued' END, r_owner, r_lease, r_started,
                r_updated)
            ON CONFLICT (run_id) DO UPDATE SET status = EXCLUDED.status,
                owner = EXCLUDED.owner, lease_until = EXCLUDED.lease_until,
                updated_at = EXCLUDED.updated_at
            WHERE r.status IN ('queued', 'running');
        END IF;
        IF NOT got THEN
            RETURN QUERY SELECT found_owner, false, NULL::text, NULL::integer, NULL::integer,
                NULL::bytea;
            RETURN;
        END IF;
        RETURN QUERY
        SELECT found_owner, true, c.summary, c.summary_covered, m.seq, m.payload
        FROM (SELECT 1) AS one
        LEFT JOIN atmosphere_conversations AS c
            ON c.endpoint = p_endpoint AND c.user_key = p_user_key
            AND c.conversation_id = p_conversation
        LEFT JOIN LATERAL (
            SELECT seq, payload FROM atmosphere_messages
            WHERE conversation = c.id AND seq > coalesce(after_seq, c.summary_seq)
            ORDER BY seq DESC LIMIT max_rows
        ) AS m ON true
        ORDER BY m.seq DESC;
    END
    $$;
    """,
    # 16: how many replicas follow a run (`PostgresRunStore.watch`): a write of its frames
    # sends its notice only while one does.
    """
    ALTER TABLE atmosphere_runs ADD COLUMN followers integer NOT NULL DEFAULT 0;
    """,
)
"""Migration `n` (1-based) is `MIGRATIONS[n - 1]`; append, never edit a released one."""

SCHEMA_VERSION = len(MIGRATIONS)


async def migrate(connection: Any) -> int:
    """Bring the schema to `SCHEMA_VERSION` (idempotent, safe concurrently); returns it."""
    async with connection.transaction():
        await connection.execute("SELECT pg_advisory_xact_lock($1)", MIGRATION_LOCK)
        await connection.execute(
            "CREATE TABLE IF NOT EXISTS atmosphere_schema ("
            "version integer PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())"
        )
        current = int(
            await connection.fetchval("SELECT coalesce(max(version), 0) FROM atmosphere_schema")
        )
        if current > SCHEMA_VERSION:
            raise SchemaTooNew(
                f"the PostgreSQL schema is at version {current}, newer than this library's "
                f"{SCHEMA_VERSION}: upgrade atmosphere-harness on this replica"
            )
        for version in range(current + 1, SCHEMA_VERSION + 1):
            await connection.execute(MIGRATIONS[version - 1])
            await connection.execute("INSERT INTO atmosphere_schema (version) VALUES ($1)", version)
    return SCHEMA_VERSION
