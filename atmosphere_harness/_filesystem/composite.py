"""`CompositeAgentFileSystem`: one namespace, several bounded backends, routed by path prefix.

A route `memory/ -> backend` sends every path equal to `memory` or below `memory/` to that
backend, unchanged (the prefix is a routing key, not stripped). The longest matching prefix wins,
segment-aware (`memoryfoo` is not under `memory`); anything else goes to the default backend.
Each backend enforces its own bounds and path checks; the composite adds no lock of its own.

Whole-namespace operations stay consistent with routing: `ls`, `glob` and `grep` only report a
path from the backend that path routes to, so a file the default backend holds under a routed
prefix (written before the route existed) is never listed and then unreadable. Listing a
directory shows the routed prefixes below it as directories, even before anything was written
there, so the model can discover them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

from .._errors import FileSystemError
from .base import AgentFileSystem, FileInfo, GrepHit
from .paths import check_dir, is_under, normalize_route_prefix

DEFAULT_GREP_HITS = 500
V = TypeVar("V")


def normalize_routes(routes: Mapping[str, V]) -> dict[str, V]:
    """Route keys normalized (one trailing `/` stripped); malformed or duplicate keys raise."""
    normalized: dict[str, V] = {}
    for prefix, target in routes.items():
        key = normalize_route_prefix(prefix)
        if key in normalized:
            raise FileSystemError(f"duplicate route prefix: {prefix} (normalizes to '{key}')")
        if target is None:
            raise FileSystemError(f"route filesystem must not be null for prefix: {prefix}")
        normalized[key] = target
    return normalized


class CompositeAgentFileSystem:
    """Routes each call to the backend whose prefix matches the path (longest first).

    Example:
        ```python
        fs = CompositeAgentFileSystem(
            WorkspaceAgentFileSystem("/srv/scratch"),
            {"memory/": WorkspaceAgentFileSystem("/srv/memory")},
        )
        await fs.write("memory/prefs.md", "...")   # stored at /srv/memory/memory/prefs.md
        ```
    """

    def __init__(
        self,
        default: AgentFileSystem,
        routes: Mapping[str, AgentFileSystem],
        *,
        max_grep_hits: int | None = None,
    ) -> None:
        if default is None:
            raise FileSystemError("default filesystem must not be null")
        normalized = normalize_routes(routes)
        self.default = default
        self.routes: dict[str, AgentFileSystem] = {
            key: normalized[key] for key in sorted(normalized, key=lambda key: (-len(key), key))
        }
        cap = max_grep_hits or getattr(default, "max_grep_hits", None) or DEFAULT_GREP_HITS
        self.max_grep_hits: int = cap

    def __repr__(self) -> str:
        return f"CompositeAgentFileSystem({self.default!r}, {self.routes!r})"

    def route(self, path: str) -> AgentFileSystem:
        """The backend that owns `path` (a relative path, already trimmed)."""
        for key, backend in self.routes.items():
            if is_under(path, key):
                return backend
        return self.default

    def _owner(self, path: object) -> AgentFileSystem:
        if not isinstance(path, str) or not path.strip():
            raise FileSystemError("path must not be blank")
        return self.route(path.strip())

    def _backends(self) -> list[AgentFileSystem]:
        """Every distinct backend: the default first, then the routes longest first."""
        seen: list[AgentFileSystem] = [self.default]
        for backend in self.routes.values():
            if all(backend is not other for other in seen):
                seen.append(backend)
        return seen

    def _below(self, directory: str) -> list[str]:
        """Route keys strictly below `directory` (`""` is the root)."""
        return [
            key
            for key in self.routes
            if key != directory and (not directory or is_under(key, directory))
        ]

    # --- routed one-path operations ----------------------------------------------------------

    async def read(self, path: str) -> str:
        return await self._owner(path).read(path)

    async def write(self, path: str, content: str) -> None:
        await self._owner(path).write(path, content)

    async def edit(
        self, path: str, old_text: str, new_text: str, *, replace_all: bool = False
    ) -> int:
        return await self._owner(path).edit(path, old_text, new_text, replace_all=replace_all)

    async def delete(self, path: str) -> None:
        await self._owner(path).delete(path)

    async def rename(self, old_path: str, new_path: str) -> None:
        source, destination = self._owner(old_path), self._owner(new_path)
        if source is not destination:
            raise FileSystemError(
                f"cross-backend rename is not supported: {old_path} -> {new_path} "
                "(source and destination route to different backends)"
            )
        await source.rename(old_path, new_path)

    # --- whole-namespace operations -------------------------------------------------------

    async def ls(self, dir: str | None = None) -> list[FileInfo]:
        directory = check_dir(dir)
        owner = self.route(directory) if directory else self.default
        entries: dict[str, FileInfo] = {}
        for entry in await owner.ls(dir if directory else None):
            if self.route(entry.path) is owner:
                entries[entry.path] = entry
        depth = directory.count("/") + 1 if directory else 0
        for key in self._below(directory):
            child = "/".join(key.split("/")[: depth + 1])
            entries.setdefault(child, FileInfo(child, 0, True))
        return sorted(entries.values(), key=lambda entry: (not entry.directory, entry.path))

    async def glob(self, pattern: str) -> list[str]:
        found: set[str] = set()
        for backend in self._backends():
            found.update(
                path for path in await backend.glob(pattern) if self.route(path) is backend
            )
        return sorted(found)

    async def grep(self, pattern: str, dir: str | None = None) -> list[GrepHit]:
        directory = check_dir(dir)
        owner = self.route(directory) if directory else self.default
        scopes: list[tuple[AgentFileSystem, str | None]] = [(owner, directory or None)]
        for key in self._below(directory):
            scopes.append((self.routes[key], key))
        hits: list[GrepHit] = []
        for backend, scope in scopes:
            for hit in await backend.grep(pattern, scope):
                if self.route(hit.path) is backend:
                    hits.append(hit)
                    if len(hits) >= self.max_grep_hits:
                        return hits
        return hits
