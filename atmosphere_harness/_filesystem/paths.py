"""Validation of the paths a model passes to the file tools.

Every path argument goes through `check_path` before it touches the disk. The rules are those of
Atmosphere's Java harness (blank, backslash, absolute, empty/`.`/`..` segments), plus what POSIX
needs: NUL and other control characters, text that is not valid Unicode, over-long paths and names,
and the name suffix reserved for in-flight atomic writes. Only whole segments are checked, so a
name such as `report..final.md` is allowed. Containment on the resolved real path (symlinks) needs
the disk: it is `containment.resolve`'s job.

Also here: `store_key`, the absolute path that names a store directory, and
`conversation_dir_name`, a conversation id checked for use as a directory name.
"""

from __future__ import annotations

import os
import re

from .._errors import FileSystemError
from .._ids import check_conversation_id

MAX_PATH_CHARS = 1024
"""Longest relative path accepted, in characters."""

MAX_SEGMENT_BYTES = 200
"""Longest file or directory name, in UTF-8 bytes: the 255-byte name limit of common file
systems, less room for the temporary name an atomic write derives from it."""

TEMP_SUFFIX = ".atmosphere-tmp"
"""Suffix of the temporary files atomic writes create next to their target (reserved)."""


_CONTROL = re.compile("[\x00-\x1f\x7f]")
"""A control character (what `shown` escapes and `check_path` refuses): one C-level scan, where
a per-character test in Python took 2-3 us for a typical path (twice per call)."""


def shown(value: str) -> str:
    """`value` as an error message may echo it: control characters escaped, the rest as given."""
    if _CONTROL.search(value) is None:
        return value
    return "".join(char if " " <= char != "\x7f" else f"\\x{ord(char):02x}" for char in value)


def check_path(path: object) -> str:
    """The trimmed relative path, or `FileSystemError` saying what is wrong with it."""
    if not isinstance(path, str) or not path.strip():
        raise FileSystemError("path must not be blank")
    text = path.strip()
    echo = shown(path)
    if "\x00" in text:
        raise FileSystemError(f"path must not contain NUL characters: {echo}")
    if _CONTROL.search(text) is not None:
        raise FileSystemError(f"path must not contain control characters: {echo}")
    if "\\" in text:
        raise FileSystemError(f"path must use forward slashes: {echo}")
    if text.startswith("/"):
        raise FileSystemError(f"path must be relative: {echo}")
    if len(text) > MAX_PATH_CHARS:
        raise FileSystemError(f"path is too long: {len(text)} chars (limit {MAX_PATH_CHARS})")
    one_byte = text.isascii()  # then every character is one byte, and valid
    if not one_byte:
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise FileSystemError(f"path is not valid Unicode text: {echo}") from None
    for segment in text.split("/"):
        if segment in ("", ".", ".."):
            raise FileSystemError(f"path contains an illegal segment ('{segment}'): {echo}")
        size = len(segment) if one_byte else len(segment.encode("utf-8"))
        if size > MAX_SEGMENT_BYTES:
            raise FileSystemError(
                f"path has a name of {size} bytes, over the {MAX_SEGMENT_BYTES}-byte limit: {echo}"
            )
        if segment.endswith(TEMP_SUFFIX):
            raise FileSystemError(f"names ending in {TEMP_SUFFIX} are reserved: {echo}")
    return text


def check_dir(path: str | None) -> str:
    """A directory argument: `None`, blank or `.` is the root (`""`); anything else a path."""
    if path is None or not path.strip() or path.strip() == ".":
        return ""
    return check_path(path)


def normalize_route_prefix(prefix: object) -> str:
    """A composite route key as Atmosphere normalizes it (one trailing `/` stripped)."""
    if not isinstance(prefix, str) or not prefix.strip():
        raise FileSystemError("route prefix must not be blank")
    text = prefix.strip()
    if "\\" in text:
        raise FileSystemError(f"route prefix must use forward slashes: {prefix}")
    key = text[:-1] if text.endswith("/") else text
    if not key or key.startswith("/"):
        raise FileSystemError(f"route prefix must be a relative, non-root path: {prefix}")
    for segment in key.split("/"):
        if segment in ("", ".", ".."):
            raise FileSystemError(f"route prefix has an illegal segment ('{segment}'): {prefix}")
    check_path(key)
    return key


def is_under(path: str, key: str) -> bool:
    """Segment-aware prefix test: `memory/a` is under `memory`, `memoryfoo` is not."""
    return path == key or path.startswith(key + "/")


def store_key(root: str | os.PathLike[str]) -> str:
    """The absolute path that identifies a store directory."""
    return os.path.abspath(os.path.expanduser(os.fspath(root)))


def conversation_dir_name(conversation_id: str) -> str:
    """A conversation id checked for use as a directory name."""
    if not isinstance(conversation_id, str) or not conversation_id.strip():
        raise FileSystemError("conversationId must not be blank")
    try:
        return check_conversation_id(conversation_id)
    except ValueError as exc:
        raise FileSystemError(f"{exc}: {shown(conversation_id)}") from None
