"""Run logs: the embedded journal's frames and checkpoints, one append-only file per run.

An append is one record, written with one `write()`: into the page cache, so it survives a
SIGKILL of the process the moment the call returns, and costs what copying its bytes does (an
SQLite row of the same payload cost several times that: a page and a WAL frame per KiB, then
a checkpoint copying it into the database file, then deleting it again when the run ends).

A record is `MAGIC`, the body's length, the body, the length again. The body is entries, each a
kind (`F` frame, `C` checkpoint), a seq (frames; 0 for checkpoints), the lengths of its name
(the event, the key) and of its data, then the name and the data (UTF-8, lone surrogates kept).
A reader takes records up to the first that is cut short or does not check out (a write a
SIGKILL interrupted between pages, or the zeroes a power cut can leave) and ignores the rest;
the next writer of that run first cuts the file back to what was read (`RunLogs.open`).

Payloads (`encode_payload`) are JSON, except that long strings (a model's 50 KiB tool-call
argument, a file a tool read) are not escaped into it: each is left out of the JSON, which holds
a placeholder for it, and follows it as it is (escaping 50 KiB into JSON costs more than the rest
of the append). `decode_payload` gives back what `json.loads` of the JSON text would. Lifted
strings of 4 KiB or more (`SEPARATE_FROM`) are not even joined to the JSON before the write: the
payload (`Lifted`) keeps them as they are and the record goes out with one `writev()` of its
parts (`pack_parts`), so a 50 KiB argument is copied once, into UTF-8, on its way to the page
cache. The bytes on disk are the same either way.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import struct
import threading
import uuid
from collections import OrderedDict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

MAGIC = b"AJR1"
HEAD = struct.Struct("<4sI")
TAIL = struct.Struct("<I")
ENTRY = struct.Struct("<cqII")
OPEN_FILES = 64
"""Run logs kept open for appending at most (the least recently written is closed first)."""
SPARE_SUFFIX = ".spare"
"""Emptied logs kept for the next runs, `<pid>-<token>-<n>.spare` (`RunLogs.remove`): removed
once their process is gone (`RunLogs.sweep_spares`)."""
SPARES = 4
"""Finished runs' logs kept, emptied and open, for the next runs' first writes: a new run's log
is a rename, not a new file (creating one cost 0.3 to 0.6 ms on a busy disk journal)."""

RAW_FROM = 1024
"""Strings at least this long (characters) follow a payload's JSON as they are."""
LIFTED = "\x00"
"""Starts a payload with lifted strings, and each placeholder for one inside its JSON (a string
of the payload that starts with it is lifted whatever its length, so placeholders are unique)."""

Entries = tuple[list[tuple[int, str, bytes]], list[tuple[str, bytes]]]

SEPARATE_FROM = 4096
"""A record's payloads of at least this many bytes are handed to `os.writev` as they are, not
copied into one buffer with the rest of the record first."""
MAX_PARTS = 512
"""At most this many buffers go to one `writev` (the system's limit is 1024); a record that
would need more is joined into one."""


class Lifted(str):
    """A payload with lifted strings, in two pieces (`encode_parts`): this text (`LIFTED`, the
    JSON's length, `:`, the JSON) and `strings`, the lifted strings, which follow it as
    `<length>:<string>` each. The run log writes them as they are (`pack_parts`): a model's
    50 KiB argument is not copied into one long string first (nor is that string's memory
    taken, touched and given back on every model turn). `whole()` is the payload as one text;
    only this store's appends read the pieces (`payload_size`, `pack_parts`)."""

    strings: tuple[str, ...]

    def whole(self) -> str:
        parts = [str(self)]
        for string in self.strings:
            parts += (str(len(string)), ":", string)
        return "".join(parts)


def encode_parts(value: Any, encode: Callable[[Any], str]) -> str:
    """`encode_payload`, its lifted strings left aside (a `Lifted`) rather than joined to it
    when they are large (`SEPARATE_FROM` characters in all; smaller ones cost less joined)."""
    if type(value) is str and len(value) < RAW_FROM and value[:1] != LIFTED:
        return encode(value)  # (a tool's result, most often: nothing to walk)
    lifted: list[str] = []
    skeleton = _lift_dict(value, lifted) if type(value) is dict else _lift(value, lifted)
    if not lifted:
        return encode(value)
    text = encode(skeleton)
    head = f"{LIFTED}{len(text)}:{text}"
    if sum(map(len, lifted)) < SEPARATE_FROM:
        parts = [head]
        for string in lifted:
            parts += (str(len(string)), ":", string)
        return "".join(parts)
    payload = Lifted(head)
    payload.strings = tuple(lifted)
    return payload


def encode_payload(value: Any, encode: Callable[[Any], str]) -> str:
    """`value` as JSON (`encode`), its long strings lifted out of it (see the docstring):
    `LIFTED`, the JSON's length, `:`, the JSON, then each lifted string's length, `:`, it."""
    payload = encode_parts(value, encode)
    return payload.whole() if isinstance(payload, Lifted) else payload


def payload_size(data: str) -> int:
    """The characters of a payload (a `Lifted` one's strings included)."""
    if isinstance(data, Lifted):
        return len(data) + sum(len(string) + 8 for string in data.strings)
    return len(data)


def decode_payload(text: str) -> Any:
    """What `encode_payload` encoded (plain JSON text too)."""
    if not text.startswith(LIFTED):
        return json.loads(text)
    lifted: list[str] = []
    at = 1
    while at < len(text):
        colon = text.index(":", at)
        end = colon + 1 + int(text[at:colon])
        if end > len(text):
            raise ValueError("a lifted payload is cut short")
        lifted.append(text[colon + 1 : end])
        at = end
    return _restore(json.loads(lifted[0]), lifted, 1)


def _lift(value: Any, lifted: list[str]) -> Any:
    """`value` with its long strings replaced by placeholders (appended to `lifted`); `value`
    itself when it has none. Only what JSON encodes as an object, array or string is walked
    (copied only where something was lifted: most payloads are small and walked, not built).
    This walk runs on every payload of every model turn: each container's items are looked
    at in place, by their exact type first (a short string or a number costs a type check,
    not a call), and a dict or a list is walked by its own function."""
    if isinstance(value, str):
        if len(value) >= RAW_FROM or value[:1] == LIFTED:
            lifted.append(value)
            return f"{LIFTED}{len(lifted) - 1}"
        return value
    if isinstance(value, dict):
        return _lift_dict(value, lifted)
    if isinstance(value, _SEQUENCES):
        return _lift_items(value, lifted)
    return value


def _lift_dict(value: dict[Any, Any], lifted: list[str]) -> dict[Any, Any]:
    changed: dict[Any, Any] | None = None
    for key, item in value.items():
        kind = type(item)
        if kind is str:
            if len(item) < RAW_FROM and item[:1] != LIFTED:
                continue
            lifted.append(item)
            new: Any = f"{LIFTED}{len(lifted) - 1}"
        elif kind is dict:
            new = _lift_dict(item, lifted)
        elif kind is list:
            new = _lift_items(item, lifted)
        elif isinstance(item, _WALKED):
            new = _lift(item, lifted)
        else:
            continue
        if new is not item:
            if changed is None:
                changed = {}
            changed[key] = new
    return value if changed is None else {**value, **changed}


def _lift_items(value: list[Any] | tuple[Any, ...], lifted: list[str]) -> Any:
    items: list[Any] | None = None
    for index, item in enumerate(value):
        kind = type(item)
        if kind is str:
            if len(item) < RAW_FROM and item[:1] != LIFTED:
                continue
            lifted.append(item)
            new: Any = f"{LIFTED}{len(lifted) - 1}"
        elif kind is dict:
            new = _lift_dict(item, lifted)
        elif kind is list:
            new = _lift_items(item, lifted)
        elif isinstance(item, _WALKED):
            new = _lift(item, lifted)
        else:
            continue
        if new is not item:
            if items is None:
                items = list(value)
            items[index] = new
    return value if items is None else items


_WALKED = (str, dict, list, tuple)
_SEQUENCES = (list, tuple)


def _restore(value: Any, lifted: list[str], first: int) -> Any:
    if isinstance(value, str):
        return lifted[first + int(value[1:])] if value.startswith(LIFTED) else value
    if isinstance(value, dict):
        for key, item in value.items():
            if isinstance(item, str | dict | list):
                value[key] = _restore(item, lifted, first)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            if isinstance(item, str | dict | list):
                value[index] = _restore(item, lifted, first)
    return value


def _utf8(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")


def pack(frames: Sequence[tuple[int, str, str]], checkpoints: Sequence[tuple[str, str]]) -> bytes:
    """One record holding `frames` and `checkpoints`."""
    return b"".join(pack_parts(frames, checkpoints))


def pack_parts(
    frames: Sequence[tuple[int, str, str]], checkpoints: Sequence[tuple[str, str]]
) -> list[bytes]:
    """`pack`'s record as buffers to write one after the other (`RunLogs.write`): a payload's
    large pieces (`SEPARATE_FROM`, a `Lifted` payload's strings) are buffers of their own
    instead of being copied again into one."""
    parts: list[bytes] = []
    small: list[bytes] = [b""]  # (the head, once the size is known)
    size = 0
    entry, overhead = ENTRY.pack, ENTRY.size

    def add(kind: bytes, seq: int, name_bytes: bytes, data: str, payload: bytes) -> None:
        """An entry with a large or `Lifted` payload (`payload`: `data`'s own text encoded)."""
        nonlocal small, size
        pieces = [payload]
        length = len(payload)
        if isinstance(data, Lifted):
            for string in data.strings:
                prefix = b"%d:" % len(string)
                lifted = _utf8(string)
                pieces += (prefix, lifted)
                length += len(prefix) + len(lifted)
        small += (entry(kind, seq, len(name_bytes), length), name_bytes)
        size += overhead + len(name_bytes) + length
        for piece in pieces:
            if len(piece) < SEPARATE_FROM:
                small.append(piece)
            else:
                parts.extend((b"".join(small), piece))
                small = []

    # Most entries are a short plain payload: added right here (this runs for every model
    # turn of every durable run; a call per entry cost a third of it).
    for seq, event, data in frames:
        name_bytes = event.encode("utf-8", "surrogatepass")
        payload = data.encode("utf-8", "surrogatepass")
        if type(data) is str and len(payload) < SEPARATE_FROM:
            small += (entry(b"F", seq, len(name_bytes), len(payload)), name_bytes, payload)
            size += overhead + len(name_bytes) + len(payload)
        else:
            add(b"F", seq, name_bytes, data, payload)
    for key, value in checkpoints:
        name_bytes = key.encode("utf-8", "surrogatepass")
        payload = value.encode("utf-8", "surrogatepass")
        if type(value) is str and len(payload) < SEPARATE_FROM:
            small += (entry(b"C", 0, len(name_bytes), len(payload)), name_bytes, payload)
            size += overhead + len(name_bytes) + len(payload)
        else:
            add(b"C", 0, name_bytes, value, payload)
    small.append(TAIL.pack(size))
    parts.append(b"".join(small))
    parts[0] = HEAD.pack(MAGIC, size) + parts[0]
    if len(parts) > MAX_PARTS:
        return [b"".join(parts)]
    return parts


def unpack(data: bytes) -> tuple[Entries, int]:
    """The entries of every whole record in `data`, in order, and the bytes they take."""
    frames: list[tuple[int, str, bytes]] = []
    checkpoints: list[tuple[str, bytes]] = []
    view = memoryview(data)
    at = 0
    while at + HEAD.size + TAIL.size <= len(data):
        magic, size = HEAD.unpack_from(data, at)
        end = at + HEAD.size + size
        if magic != MAGIC or end + TAIL.size > len(data) or TAIL.unpack_from(data, end)[0] != size:
            break
        entries = _entries(view[at + HEAD.size : end])
        if entries is None:
            break
        frames += entries[0]
        checkpoints += entries[1]
        at = end + TAIL.size
    return (frames, checkpoints), at


def _entries(body: memoryview) -> Entries | None:
    frames: list[tuple[int, str, bytes]] = []
    checkpoints: list[tuple[str, bytes]] = []
    at = 0
    while at < len(body):
        if at + ENTRY.size > len(body):
            return None
        kind, seq, name_size, data_size = ENTRY.unpack_from(body, at)
        at += ENTRY.size
        if at + name_size + data_size > len(body) or kind not in (b"F", b"C"):
            return None
        name = bytes(body[at : at + name_size]).decode("utf-8", "surrogatepass")
        payload = bytes(body[at + name_size : at + name_size + data_size])
        at += name_size + data_size
        if kind == b"F":
            frames.append((seq, name, payload))
        else:
            checkpoints.append((name, payload))
    return frames, checkpoints


class RunLogs:
    """The run logs in one directory, by the run's row id (`<row>.log`)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._files: OrderedDict[int, int] = OrderedDict()
        """Row -> an open descriptor for appending, least recently written first."""
        self._read: dict[int, int] = {}
        """Row -> the bytes of whole records a `read` found (the next writer cuts back to it)."""
        self._spares: list[tuple[Path, int]] = []
        """Emptied logs of finished runs and their open descriptors, for new runs (`SPARES`)."""
        self._named = itertools.count()
        self._token = uuid.uuid4().hex[:12]
        """Names this instance's spares apart from another's on the same directory."""
        self.lock = threading.Lock()
        """Held around every use of the logs: the event loop never waits for it (it tries, and
        leaves the work to the database thread if another thread holds it)."""

    def path(self, row: int) -> Path:
        return self.directory / f"{row}.log"

    def write(self, row: int, record: bytes | Sequence[bytes], *, new: bool = False) -> None:
        """Append `record` (bytes, or buffers written one after the other with one `writev`:
        `pack_parts`) to run `row`'s log (`new`: a run just created, whose log starts empty);
        the data is in the page cache when this returns."""
        fd = self._files.get(row)
        if fd is None:
            fd = self._open(row, new)
        else:
            self._files.move_to_end(row)
        if isinstance(record, bytes):
            size = len(record)
            written = os.write(fd, record)
        else:
            size = sum(map(len, record))
            written = os.writev(fd, record) if len(record) > 1 else os.write(fd, record[0])
        if written != size:
            # A short write (a full disk): cut the record off, so the log stays whole.
            os.ftruncate(fd, os.lseek(fd, 0, os.SEEK_END) - written)
            raise OSError(f"run log {self.path(row)}: short write ({written} of {size})")

    def _open(self, row: int, new: bool) -> int:
        if new and self._spares:
            spare, fd = self._spares.pop()
            try:
                os.rename(spare, self.path(row))  # (over any log of that row: it starts empty)
            except OSError:
                _close_and_unlink(fd, spare)
            else:
                self._files[row] = fd
                self._close_oldest()
                return fd
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC
        try:
            fd = os.open(self.path(row), flags | (os.O_TRUNC if new else 0), 0o600)
        except FileNotFoundError:
            self.directory.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path(row), flags | (os.O_TRUNC if new else 0), 0o600)
        whole = self._read.pop(row, None)
        if whole is not None and not new and os.fstat(fd).st_size > whole:
            # A record a crash cut short: appends go after the last whole one.
            os.ftruncate(fd, whole)
        self._files[row] = fd
        self._close_oldest()
        return fd

    def _close_oldest(self) -> None:
        while len(self._files) > OPEN_FILES:
            _, oldest = self._files.popitem(last=False)
            os.close(oldest)

    def read(self, row: int) -> Entries:
        """Every entry of run `row`'s whole records (none if it has no log)."""
        try:
            data = self.path(row).read_bytes()
        except FileNotFoundError:
            return [], []
        entries, whole = unpack(data)
        if whole < len(data) and row not in self._files:
            self._read[row] = whole
        return entries

    def remove(self, row: int) -> None:
        """Remove run `row`'s log. A log this process wrote is emptied first and kept, under a
        spare's name, for a new run (`SPARES`); a crash in between leaves an empty log of a
        finished run or a spare of a dead process, both swept at the next start."""
        fd = self._files.pop(row, None)
        self._read.pop(row, None)
        path = self.path(row)
        if fd is not None and len(self._spares) < SPARES:
            name = f"{os.getpid()}-{self._token}-{next(self._named)}{SPARE_SUFFIX}"
            spare = self.directory / name
            try:
                os.ftruncate(fd, 0)
                os.rename(path, spare)
            except OSError:
                pass
            else:
                self._spares.append((spare, fd))
                return
        if fd is not None:
            os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()

    def rows(self) -> list[int]:
        """The rows that have a log in the directory."""
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            return []
        return [int(name[:-4]) for name in names if name.endswith(".log") and name[:-4].isdigit()]

    def sweep_spares(self, dead: Callable[[int], bool]) -> None:
        """Remove the spare logs an earlier version left, once their process is gone
        (`dead(pid)`, or an earlier life of this pid)."""
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            return
        for name in names:
            pid, _, rest = name.partition("-")
            if not rest.endswith(SPARE_SUFFIX) or not pid.isdigit():
                continue
            if int(pid) == os.getpid() or dead(int(pid)):
                with contextlib.suppress(FileNotFoundError):
                    (self.directory / name).unlink()

    def close(self) -> None:
        """Close every descriptor and remove the spares (call with `lock` held)."""
        while self._files:
            os.close(self._files.popitem()[1])
        while self._spares:
            spare, fd = self._spares.pop()
            _close_and_unlink(fd, spare)


def _close_and_unlink(fd: int, path: Path) -> None:
    os.close(fd)
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
