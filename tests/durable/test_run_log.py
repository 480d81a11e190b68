"""The embedded journal's run logs (`durable.log`): one append-only file per run, next to the
SQLite file that holds the run rows and the history marks."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from atmosphere_harness._contracts import StoredRun
from atmosphere_harness._durable import SqliteRunStore
from atmosphere_harness._durable.log import (
    MAX_PARTS,
    RAW_FROM,
    SEPARATE_FROM,
    Lifted,
    RunLogs,
    decode_payload,
    encode_payload,
    pack,
    pack_parts,
)
from atmosphere_harness._jsontext import compact_json
from atmosphere_harness._kernel.writer import encode


def stored(run_id: str = "run-1") -> StoredRun:
    return StoredRun(run_id, "/p", "conv", "ann", "session", "hello", 1.0)


def frame(seq: int, text: str = "x") -> tuple[int, str, str]:
    return seq, "text", SqliteRunStore.encode({"text": text})


def checkpoint(key: str, value: Any) -> tuple[str, str]:
    return key, SqliteRunStore.encode(value)


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteRunStore]:
    store = SqliteRunStore.under(tmp_path)
    await store.open()
    try:
        yield store
    finally:
        await store.aclose()


def logs_of(tmp_path: Path) -> list[Path]:
    return sorted((tmp_path / "atmosphere.db-runs").glob("*.log"))


async def test_a_record_a_crash_cut_short_is_ignored_and_written_over(tmp_path: Path) -> None:
    store = SqliteRunStore.under(tmp_path)
    await store.open()
    await store.append("run-1", [frame(1)], [checkpoint("model:1", {"text": "a"})], create=stored())
    await store.aclose()
    [log] = logs_of(tmp_path)
    # What a SIGKILL in the middle of the next `write()` leaves: part of a record.
    torn = pack([frame(2, "lost")], [checkpoint("model:2", {"text": "lost"})])
    with log.open("ab") as file:
        file.write(torn[: len(torn) // 2])
    resumed = SqliteRunStore.under(tmp_path)
    await resumed.open()
    try:
        checkpoints, frames = await resumed.load("run-1", 10)
        assert checkpoints == {"model:1": {"text": "a"}}
        assert [f.seq for f in frames] == [1]
        # The resumed run writes on: after the last whole record, not after the torn one.
        assert resumed.append_now("run-1", [frame(2, "again")], [])
        checkpoints, frames = await resumed.load("run-1", 10)
        assert [(f.seq, f.data["text"]) for f in frames] == [(1, "x"), (2, "again")]
    finally:
        await resumed.aclose()


async def test_the_history_mark_is_a_row_next_to_the_history_the_rest_is_in_the_log(
    store: SqliteRunStore, tmp_path: Path
) -> None:
    await store.append(
        "run-1",
        [frame(1)],
        [checkpoint("model:1", {"text": "a"}), checkpoint("history:1", 1)],
        create=stored(),
    )
    with sqlite3.connect(tmp_path / "atmosphere.db") as connection:
        rows = connection.execute("SELECT key FROM durable_checkpoints").fetchall()
        frames = connection.execute("SELECT count(*) FROM durable_frames").fetchone()
    assert rows == [("history:1",)]
    assert frames == (0,)
    [log] = logs_of(tmp_path)
    assert b'"text":"a"' in log.read_bytes()
    assert (await store.load("run-1", 10))[0] == {"model:1": {"text": "a"}, "history:1": 1}


async def test_a_log_append_is_made_on_the_loop_while_the_database_thread_is_busy(
    store: SqliteRunStore,
) -> None:
    assert store.append_now("run-1", [frame(1)], [], create=stored(), owner="me")
    entered, release = threading.Event(), threading.Event()

    def busy(connection: sqlite3.Connection) -> None:
        entered.set()
        release.wait(10)

    held = asyncio.ensure_future(store.database.run(busy))
    try:
        await asyncio.to_thread(entered.wait, 10)
        # The thread holds the connection (a history write, a checkpoint): a frame of a run
        # the store knows still goes to its log right here.
        assert store.append_now("run-1", [frame(2)], [checkpoint("result:1:a", "done")])
        assert not store.append_now("run-1", [], [checkpoint("history:1", 1)])  # SQLite's
    finally:
        release.set()
        await held
    checkpoints, frames = await store.load("run-1", 10)
    assert [f.seq for f in frames] == [1, 2]
    assert checkpoints == {"result:1:a": "done"}


async def test_finish_removes_the_log_and_open_sweeps_a_left_over_one(tmp_path: Path) -> None:
    store = SqliteRunStore.under(tmp_path)
    await store.open()
    await store.append("done", [frame(1)], [], create=stored("done"), owner="me")
    await store.append("open", [frame(1)], [], create=stored("open"), owner="me")
    assert len(logs_of(tmp_path)) == 2
    await store.finish("done")
    [kept] = logs_of(tmp_path)
    await store.aclose()
    # A crash between `finish`'s commit and the removal of the log leaves the log behind.
    left_over = kept.with_name("999.log")
    left_over.write_bytes(pack([frame(1)], []))
    again = SqliteRunStore.under(tmp_path)
    await again.open()
    try:
        assert logs_of(tmp_path) == [kept]
        assert [f.seq for f in (await again.load("open", 10))[1]] == [1]
    finally:
        await again.aclose()


def spares_of(tmp_path: Path) -> list[Path]:
    return sorted((tmp_path / "atmosphere.db-runs").glob("*.spare"))


async def test_open_sweeps_the_spares_a_gone_process_left(tmp_path: Path) -> None:
    directory = tmp_path / "atmosphere.db-runs"
    directory.mkdir()
    gone = directory / "999999999-0a1b2c.spare"  # (no such pid)
    alive = directory / "1-0a1b2c.spare"  # (pid 1 runs: another process's, left alone)
    for path in (gone, alive):
        path.touch()
    store = SqliteRunStore.under(tmp_path)
    await store.open()
    try:
        assert not gone.exists()
        assert spares_of(tmp_path) == [alive]
    finally:
        await store.aclose()
    assert spares_of(tmp_path) == [alive]


async def test_a_finished_runs_log_emptied_is_the_next_runs_log(tmp_path: Path) -> None:
    store = SqliteRunStore.under(tmp_path)
    await store.open()
    try:
        assert store.append_now("first", [frame(1, "a" * 5000)], [], create=stored("first"))
        await store.finish("first")
        # Kept, empty, under a spare's name: the next run's log is a rename, not a new file.
        assert logs_of(tmp_path) == []
        [spare] = spares_of(tmp_path)
        assert spare.stat().st_size == 0
        inode = spare.stat().st_ino
        assert store.append_now("second", [frame(1, "b")], [], create=stored("second"))
        assert spares_of(tmp_path) == []
        [log] = logs_of(tmp_path)
        assert log.stat().st_ino == inode
        assert [f.data["text"] for f in (await store.load("second", 10))[1]] == ["b"]
        await store.finish("second")
    finally:
        await store.aclose()
    assert spares_of(tmp_path) == []  # (removed at close)
    assert logs_of(tmp_path) == []


@pytest.mark.parametrize(
    "value",
    [
        {"text": "", "calls": [["call_1", "write_file", {"path": "a", "content": "x\n" * 900}]]},
        "y" * RAW_FROM,
        "y" * (RAW_FROM - 1),
        {"nested": [("\x00 starts like a placeholder", ["\x000"]), {"k": "é\ud800" * RAW_FROM}]},
        {"1": [1, 2.5, None, True], 2: "int key"},
        ["short", "z" * 5000, "z" * 5000],
        {"odd": object()},
    ],
)
def test_a_payload_decodes_as_its_json_would(value: Any) -> None:
    text = encode_payload(value, encode)
    assert decode_payload(text) == json.loads(encode(value))


def test_a_long_string_follows_the_json_unescaped() -> None:
    content = 'a "quoted" line\n' * 100
    text = encode_payload({"content": content, "short": "b\n"}, encode)
    assert text.endswith(content)
    assert '"short":"b\\n"' in text


PAYLOADS = [
    {"text": "", "calls": [["call_1", "write_file", {"path": "a", "content": "x\n" * 900}]]},
    "y" * RAW_FROM,
    {"nested": [("\x00 starts like a placeholder", ["\x000"]), {"k": "é\ud800" * RAW_FROM}]},
    {"1": [1, 2.5, None, True, float("nan")], 2: "int key", "odd": object()},
    ["short", "z" * 5000, "z" * 5000],
    True,
]


@pytest.mark.parametrize("value", PAYLOADS)
def test_the_journals_json_is_the_standard_encoders(value: Any) -> None:
    standard = json.JSONEncoder(separators=(",", ":"), default=str).encode
    assert compact_json(default=str, check_circular=False)(value) == standard(value)


@pytest.mark.parametrize("value", PAYLOADS)
def test_a_payload_with_long_strings_is_written_in_pieces_as_one_record(value: Any) -> None:
    payload = SqliteRunStore.encode(value)
    whole = encode_payload(value, encode)
    assert (payload.whole() if isinstance(payload, Lifted) else payload) == whole
    parts = pack_parts([(1, "text", payload)], [("model:1", payload)])
    assert b"".join(parts) == pack([(1, "text", whole)], [("model:1", whole)])
    if isinstance(payload, Lifted):
        # The long strings are the payload's own (not copied into one string), and each of
        # the large ones goes to the log as a buffer of its own.
        assert all(any(string is found for found in _strings(value)) for string in payload.strings)
        large = {len(s.encode("utf-8", "surrogatepass")) for s in payload.strings}
        assert {size for size in large if size >= SEPARATE_FROM} <= {len(part) for part in parts}


def _strings(value: Any) -> list[Any]:
    if isinstance(value, dict):
        return [s for item in value.values() for s in _strings(item)]
    if isinstance(value, list | tuple):
        return [s for item in value for s in _strings(item)]
    return [value]


def test_a_record_of_more_pieces_than_one_writev_takes_is_one_buffer(tmp_path: Path) -> None:
    big = "b" * SEPARATE_FROM
    frames = [(seq, "text", SqliteRunStore.encode({"text": big})) for seq in range(MAX_PARTS)]
    parts = pack_parts(frames, [])
    assert len(parts) == 1
    logs = RunLogs(tmp_path)
    logs.write(1, pack_parts(frames[:3], []), new=True)
    logs.write(1, parts)
    try:
        read, _ = logs.read(1)
        assert [seq for seq, _, _ in read] == [0, 1, 2, *range(MAX_PARTS)]
        assert decode_payload(read[-1][2].decode()) == {"text": big}
    finally:
        logs.close()


async def test_long_strings_round_trip_through_the_log_and_the_history_mark(
    store: SqliteRunStore,
) -> None:
    content = "line\n" * RAW_FROM
    turn = {"text": "", "calls": [["call_1", "write_file", {"path": "a", "content": content}]]}
    assert store.append_now(
        "run-1",
        [frame(1, content)],
        [checkpoint("model:1", turn), checkpoint("history:1", {"odd": content})],
        create=stored(),
        owner="me",
    )
    checkpoints, frames = await store.load("run-1", 10)
    assert checkpoints == {"model:1": turn, "history:1": {"odd": content}}
    assert frames[0].data == {"text": content}
