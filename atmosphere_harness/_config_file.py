"""`ATMOSPHERE_CONFIG_FILE`: Atmosphere's configuration keys from a YAML, .properties or TOML file.

Users of the Java framework keep their settings in `application.yml`, `application.properties`
or servlet init-params, under keys such as `atmosphere.ai.harness.enabled`,
`quarkus.atmosphere.ai.harness.exclude-paths`, `org.atmosphere.ai.prompt-cache.default` or
`org.atmosphere.ai.toolOutputOffloadThreshold`. Point `ATMOSPHERE_CONFIG_FILE` at such a file
(or pass `HarnessSettings(config_file=...)`) and `HarnessSettings` reads it as one more
pydantic-settings source, below the environment: constructor > environment > file > defaults.

How a key is read (`SEED_KEYS` is the table, docs/configuration.md shows it):

- YAML may nest the key (`atmosphere: {ai: {harness: {enabled: true}}}`) or spell it dotted; a
  `.properties` file spells it dotted, and `key[0]=a` / `key[1]=b` make a list;
- each dot-separated part is compared without case, `-` or `_`, so `exclude-paths`,
  `excludePaths` and `exclude_paths` are one key, as are `toolOutputOffloadThreshold` and
  `tool-output-offload-threshold`;
- the prefixes `quarkus.` and `org.` in front of `atmosphere.` are interchangeable: every seed key
  is accepted with any of the three;
- a `HarnessSettings` field name or environment name at the top level (`llm_model`,
  `LLM_MODEL`, `user_id_header`) sets that field, so one file can hold every setting;
- an unknown key under `atmosphere.` (any prefix form) is ignored with one WARN naming it and the
  file; a seed key the harness has no equivalent for is ignored with one WARN saying why; keys
  outside `atmosphere.` (`server.port`, `spring.*`) belong to someone else and are left alone.

A file that is missing, unreadable or does not parse fails start-up with a `ConfigFileError`
naming `ATMOSPHERE_CONFIG_FILE` and the file.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from pydantic import AliasChoices
from pydantic_settings import (
    InitSettingsSource,
    TomlConfigSettingsSource,
    YamlConfigSettingsSource,
)

from ._errors import ConfigFileError
from ._log import get_logger

if TYPE_CHECKING:
    from pydantic_settings import BaseSettings

log = get_logger(__name__)

CONFIG_FILE_ENV = "ATMOSPHERE_CONFIG_FILE"
SUFFIXES = {".yml": "YAML", ".yaml": "YAML", ".properties": "properties", ".toml": "TOML"}


@dataclass(frozen=True)
class SeedKey:
    """One setting as Atmosphere spells it in each runtime (`None`: that runtime has none)."""

    field: str
    spring: str | None = None
    quarkus: str | None = None
    servlet: str | None = None
    """The servlet init-param or JVM system property."""


SEED_KEYS: tuple[SeedKey, ...] = (
    SeedKey(
        "enabled",
        "atmosphere.ai.harness.enabled",
        "quarkus.atmosphere.ai.harness.enabled",
        "org.atmosphere.ai.harness.enabled",
    ),
    SeedKey(
        "exclude_paths",
        "atmosphere.ai.harness.exclude-paths",
        "quarkus.atmosphere.ai.harness.exclude-paths",
        "org.atmosphere.ai.harness.exclude-paths",
    ),
    SeedKey(
        "compaction",
        "atmosphere.ai.harness.compaction",
        "quarkus.atmosphere.ai.harness.compaction",
        "org.atmosphere.ai.compaction",
    ),
    SeedKey("compaction_recent_window", servlet="org.atmosphere.ai.compaction.recent-window"),
    SeedKey(
        "prompt_cache_default",
        "atmosphere.ai.harness.prompt-cache-default",
        "quarkus.atmosphere.ai.harness.prompt-cache-default",
        "org.atmosphere.ai.prompt-cache.default",
    ),
    SeedKey("planning", servlet="atmosphere.ai.planning"),
    SeedKey("filesystem", servlet="atmosphere.ai.filesystem"),
    SeedKey("filesystem_routes", servlet="org.atmosphere.ai.filesystem.routes"),
    SeedKey(
        "tool_output_offload_threshold", servlet="org.atmosphere.ai.toolOutputOffloadThreshold"
    ),
    SeedKey("tool_execution_timeout", servlet="org.atmosphere.ai.toolExecutionTimeout"),
    SeedKey("prompt_cache_key", servlet="atmosphere.ai.prompt-cache-key"),
    SeedKey("workspace_root", servlet="atmosphere.workspace.root"),
    SeedKey(
        "durable_runs",
        "atmosphere.durable-runs.enabled",
        "quarkus.atmosphere.durable-runs.enabled",
    ),
    SeedKey("admin_http_read_auth_required", "atmosphere.admin.http-read-auth-required"),
)
"""Every seed key that has a `HarnessSettings` field, by runtime."""

QUARKUS_DURABLE_OPT_OUT = "quarkus.atmosphere.ai.harness.durable-runs"
"""Quarkus's opt-out of the durable runs `enabled=true` implies: `false` sets `durable_runs` to
false (unless the file sets `durable-runs.enabled` itself); `true` (its default) changes nothing."""

UNSUPPORTED: tuple[tuple[str, str], ...] = (
    (
        "atmosphere.admin.workspace-read-auth-required",
        "plan and file reads always require the admin token here (ATMOSPHERE_ADMIN_TOKEN)",
    ),
    (
        "atmosphere.admin.content-read-auth-required",
        "there are no governance-decision, audit or journal reads to gate here",
    ),
    (
        "atmosphere.ai.memory.store",
        "pass the store to create_harness_router(long_term_memory=...) or declare a "
        "long-term memory provider entry point",
    ),
    (
        "atmosphere.ai.governance.policies",
        "pass policies to create_harness_router(policies=[...]) or declare them as "
        "atmosphere_harness.policies entry points",
    ),
    ("atmosphere.ai.memory.safety.*", "extracted facts are always screened here"),
    ("atmosphere.tools.permissions.*", "use a GovernancePolicy or a ToolApprovalPolicy"),
    ("atmosphere.ai.cache.*", "the harness has no response cache"),
    ("atmosphere.durable-runs.*", "the run journal has no such setting here"),
)
"""Seed keys (rooted at `atmosphere.`; `.*` = the whole family) with no equivalent, and why."""

MAPPING_FIELDS = frozenset({"filesystem_routes", "filesystem_limits"})
"""Fields whose value may be a mapping (so a nested YAML map under them is the value)."""

_INDEXED = re.compile(r"^(?P<key>.+)\[(?P<index>\d{1,4})\]$")
_warned: set[tuple[str, str]] = set()


def normalize(key: str) -> str:
    """`key` as compared: each dot-separated part lower-cased without `-` or `_`."""
    return ".".join(part.replace("-", "").replace("_", "").lower() for part in key.split("."))


def rooted(key: str) -> str | None:
    """A normalized key from `atmosphere.` on (`quarkus.` / `org.` dropped); `None` if not ours."""
    for prefix in ("quarkus.", "org."):
        if key.startswith(prefix + "atmosphere."):
            return key[len(prefix) :]
    return key if key.startswith("atmosphere.") else None


def _seed_table() -> dict[str, str]:
    table: dict[str, str] = {}
    for seed in SEED_KEYS:
        for spelling in (seed.spring, seed.quarkus, seed.servlet):
            if spelling is not None:
                root = rooted(normalize(spelling))
                assert root is not None, spelling
                table[root] = seed.field
    return table


_SEED_FIELDS = _seed_table()
_OPT_OUT = rooted(normalize(QUARKUS_DURABLE_OPT_OUT))
_UNSUPPORTED = [(rooted(normalize(key.removesuffix(".*"))), key, why) for key, why in UNSUPPORTED]


def unsupported_reason(root: str) -> tuple[str, str] | None:
    """(the Atmosphere key as documented, why it is ignored) for a known key with no equivalent."""
    for prefix, key, why in _UNSUPPORTED:
        assert prefix is not None
        family = key.endswith(".*")
        if root == prefix and not family:
            return key, why
        if family and root.startswith(prefix + "."):
            return key, why
    return None


def field_names(settings_cls: type[BaseSettings]) -> dict[str, str]:
    """Normalized field name and environment names -> field, for top-level keys of a file."""
    names: dict[str, str] = {}
    for name, info in settings_cls.model_fields.items():
        names[normalize(name)] = name
        alias = info.validation_alias
        choices = alias.choices if isinstance(alias, AliasChoices) else [alias]
        for choice in choices:
            if isinstance(choice, str):
                names[normalize(choice)] = name
    return names


# --- reading -------------------------------------------------------------------------------


def read_file(settings_cls: type[BaseSettings], path: Path) -> dict[str, Any]:
    """The file's top-level mapping, parsed by its suffix (YAML and TOML by pydantic-settings)."""
    kind = SUFFIXES.get(path.suffix.lower())
    if kind is None:
        raise ConfigFileError(
            f"{CONFIG_FILE_ENV}={path}: the file must end in .yml, .yaml, .properties or .toml"
        )
    if not path.is_file():
        raise ConfigFileError(f"{CONFIG_FILE_ENV}={path}: no such file")
    data: object
    try:
        if kind == "YAML":
            data = YamlConfigSettingsSource(settings_cls, yaml_file=None)._read_file(path)
        elif kind == "TOML":
            data = TomlConfigSettingsSource(settings_cls, toml_file=None)._read_file(path)
        else:
            data = parse_properties(path.read_bytes())
    except (
        OSError,
        UnicodeDecodeError,
        RecursionError,
        yaml.YAMLError,
        tomllib.TOMLDecodeError,
    ) as exc:
        detail = " ".join(str(exc).split())[:500]
        raise ConfigFileError(
            f"{CONFIG_FILE_ENV}={path}: cannot read it as {kind}: {detail}"
        ) from None
    if not isinstance(data, dict):
        raise ConfigFileError(
            f"{CONFIG_FILE_ENV}={path}: the file must hold keys and values at its top level, "
            f"got a {type(data).__name__}"
        )
    return data


def parse_properties(raw: bytes) -> dict[str, str]:
    """A Java `.properties` file: `key=value`, `key: value` or `key value`; `#`/`!` comments;
    a trailing backslash continues the line; `\\t`, `\\n`, `\\uXXXX` and `\\=` escapes.

    UTF-8, or ISO-8859-1 (the format's historical encoding) when the bytes are not UTF-8. A
    key given twice keeps its last value, as `java.util.Properties` does.
    """
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        text = raw.decode("latin-1")
    values: dict[str, str] = {}
    for line in _logical_lines(text):
        key, value = _split_entry(line)
        values[_unescape(key)] = _unescape(value)
    return values


def _logical_lines(text: str) -> Iterator[str]:
    pending = ""
    for physical in text.splitlines():
        line = physical.lstrip(" \t\f")
        if not pending and (not line or line[0] in "#!"):
            continue
        trailing = len(line) - len(line.rstrip("\\"))
        if trailing % 2:
            pending += line[:-1]
            continue
        yield pending + line
        pending = ""
    if pending:
        yield pending


def _split_entry(line: str) -> tuple[str, str]:
    index = 0
    while index < len(line):
        char = line[index]
        if char == "\\":
            index += 2
            continue
        if char in "=: \t\f":
            break
        index += 1
    key = line[:index]
    rest = line[index:].lstrip(" \t\f")
    if rest[:1] in ("=", ":"):
        rest = rest[1:].lstrip(" \t\f")
    return key, rest


_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}


def _unescape(text: str) -> str:
    if "\\" not in text:
        return text
    out: list[str] = []
    index = 0
    while index < len(text):
        char = text[index]
        if char != "\\" or index + 1 >= len(text):
            out.append(char)
            index += 1
            continue
        escaped = text[index + 1]
        digits = text[index + 2 : index + 6]
        if escaped == "u" and re.fullmatch(r"[0-9A-Fa-f]{4}", digits):
            out.append(chr(int(digits, 16)))
            index += 6
            continue
        out.append(_ESCAPES.get(escaped, escaped))
        index += 2
    return "".join(out)


# --- translating -------------------------------------------------------------------------------


MAX_DEPTH = 32
"""Mappings nested deeper than this are refused (no seed key has more than six parts)."""


def flatten(
    data: Mapping[Any, Any], keep: Mapping[str, str], prefix: str = "", depth: int = 0
) -> Iterator[tuple[str, Any]]:
    """(dotted key, value) for every leaf of a nested mapping.

    A mapping is kept whole (not descended into) where its key names a field that takes a
    mapping (`keep`: normalized key -> field), so `filesystem_limits: {max_files: 9}` stays one
    value. Raises `ValueError` past `MAX_DEPTH` levels.
    """
    if depth > MAX_DEPTH:
        raise ValueError(f"keys are nested more than {MAX_DEPTH} levels deep")
    for raw_key, value in data.items():
        key = f"{prefix}.{raw_key}" if prefix else str(raw_key)
        if isinstance(value, Mapping) and keep.get(_lookup_key(key)) not in MAPPING_FIELDS:
            yield from flatten(value, keep, key, depth + 1)
        else:
            yield key, value


def _lookup_key(key: str) -> str:
    norm = normalize(key)
    return rooted(norm) or norm


def _gather_lists(entries: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """`key[0]=a`, `key[1]=b` (Spring's list syntax) -> `key=[a, b]`, at the first one's place."""
    order: list[tuple[str, bool]] = []
    plain: dict[str, Any] = {}
    lists: dict[str, dict[int, Any]] = {}
    for key, value in entries:
        indexed = _INDEXED.match(key)
        if indexed is None:
            order.append((key, False))
            plain[key] = value
            continue
        name = indexed["key"]
        if name not in lists:
            lists[name] = {}
            order.append((name, True))
        lists[name][int(indexed["index"])] = value
    return [
        (key, [lists[key][i] for i in sorted(lists[key])] if is_list else plain[key])
        for key, is_list in order
    ]


def _warn_once(path: Path, key: str, message: str, **fields: Any) -> None:
    marker = (str(path), key)
    if marker in _warned:
        return
    _warned.add(marker)
    log.warning(message, key=key, file=str(path), **fields)


def translate(
    settings_cls: type[BaseSettings], data: Mapping[str, Any], path: Path
) -> dict[str, Any]:
    """The file's keys as `HarnessSettings` field values (see the module docstring)."""
    names = field_names(settings_cls)
    keep = {**names, **_SEED_FIELDS}
    values: dict[str, Any] = {}
    given_by: dict[str, str] = {}
    opt_out: Any = None
    try:
        entries = _gather_lists(list(flatten(data, keep)))
    except ValueError as exc:
        raise ConfigFileError(f"{CONFIG_FILE_ENV}={path}: {exc}") from None
    for key, value in entries:
        if value is None or value == "":
            continue  # `key:` / `key=` with no value leaves the setting unset
        norm = normalize(key)
        root = rooted(norm)
        if root is None:
            field = names.get(norm) if "." not in norm else None
            if field is None or field == "config_file":
                continue  # not ours (server.port, spring.*)
        elif root == _OPT_OUT:
            opt_out = value
            continue
        elif root in _SEED_FIELDS:
            field = _SEED_FIELDS[root]
        else:
            known = unsupported_reason(root)
            if known is not None:
                _warn_once(
                    path,
                    key,
                    "configuration key has no equivalent in atmosphere-harness, ignored",
                    seed_key=known[0],
                    why=known[1],
                )
            else:
                _warn_once(path, key, "unknown configuration key, ignored")
            continue
        if field in values:
            _warn_once(
                path,
                key,
                "configuration file sets one setting twice; the later key wins",
                setting=field,
                earlier=given_by[field],
            )
        values[field] = value
        given_by[field] = key
    opted_out = opt_out is not None and str(opt_out).strip().lower() == "false"
    if opted_out and "durable_runs" not in values:
        values["durable_runs"] = False
    return values


class ConfigFileSettingsSource(InitSettingsSource):
    """The settings source of `ATMOSPHERE_CONFIG_FILE`, read once when the settings are built.

    Values are handed to pydantic-settings as init-style values (each under the field's first
    environment name, as its own sources do), so the source order in
    `HarnessSettings.settings_customise_sources` alone decides precedence.
    """

    def __init__(self, settings_cls: type[BaseSettings], path: Path) -> None:
        self.path = path.expanduser()
        data = read_file(settings_cls, self.path)
        self.values = translate(settings_cls, data, self.path)
        log.info(
            "configuration file read",
            file=str(self.path),
            settings=sorted(self.values),
        )
        super().__init__(settings_cls, dict(self.values))

    def __repr__(self) -> str:
        return f"ConfigFileSettingsSource(path={str(self.path)!r})"
