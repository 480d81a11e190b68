"""`HarnessSettings`: every configuration key, with its environment names and defaults.

Precedence is programmatic argument > environment variable > default (the Python form of
Atmosphere's Java rule "system property wins over the environment variable"). Where a key has an
`LLM_` fallback, the `ATMOSPHERE_` name is read first. The settings never read a `.env` file on
their own: the host owns its `.env` (pass `_env_file=...` to opt in). Nothing here is instantiated
at import time; the router resolves settings inside its lifespan.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from functools import cached_property
from pathlib import Path
from typing import Annotated, Any

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, field_validator
from pydantic_settings import (
    BaseSettings,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from ._cache import PromptCache, cache_key_host_allowed
from ._config_file import CONFIG_FILE_ENV, ConfigFileSettingsSource
from ._limits import (
    DEFAULT_MAX_ARGUMENT_CHARS,
    DEFAULT_MAX_TOOL_CALLS,
    FileSystemLimits,
    UsageLimits,
)
from ._log import get_logger

log = get_logger(__name__)

DEFAULT_MAX_REQUEST_BYTES = 4 * 1024 * 1024
"""`max_request_bytes` when unset: 4 MiB."""


class SurfaceMode(enum.Enum):
    """Which plan/file surface to attach: the built-in tools or the runtime's native one."""

    AUTO = "auto"
    BUILTIN = "builtin"
    NATIVE = "native"

    @classmethod
    def parse(cls, value: object) -> SurfaceMode:
        """Lenient, case-insensitive; `built-in` is accepted; anything unknown is `AUTO`."""
        if isinstance(value, SurfaceMode):
            return value
        text = str(value or "").strip().lower()
        if text in ("builtin", "built-in"):
            return cls.BUILTIN
        if text == "native":
            return cls.NATIVE
        return cls.AUTO


class Compaction(enum.Enum):
    """Conversation-memory compaction strategy."""

    SLIDING_WINDOW = "sliding-window"
    SUMMARIZING = "summarizing"
    TOKEN_WINDOW = "token-window"


class PromptCacheKeyMode(enum.Enum):
    """Whether OpenAI-compatible requests carry `prompt_cache_key`."""

    AUTO = "auto"
    ENABLED = "true"
    DISABLED = "false"

    @classmethod
    def parse(cls, value: object) -> PromptCacheKeyMode:
        if isinstance(value, PromptCacheKeyMode):
            return value
        if isinstance(value, bool):
            return cls.ENABLED if value else cls.DISABLED
        text = str(value or "").strip().lower()
        if text in ("true", "1", "yes", "on", "enabled"):
            return cls.ENABLED
        if text in ("false", "0", "no", "off", "disabled"):
            return cls.DISABLED
        return cls.AUTO

    def allows(self, base_url: str | None) -> bool:
        """Whether a request to `base_url` may carry `prompt_cache_key` under this mode."""
        if self is PromptCacheKeyMode.AUTO:
            return cache_key_host_allowed(base_url)
        return self is PromptCacheKeyMode.ENABLED


class RuntimeChoice(enum.Enum):
    """Which model runtime the router uses when none is passed explicitly."""

    AUTO = "auto"
    SCRIPTED = "scripted"
    OPENAI = "openai"
    ANTHROPIC = "anthropic"


class WorkspaceBackend(enum.Enum):
    """Where conversation workspaces live (`ATMOSPHERE_AI_WORKSPACE_BACKEND`)."""

    FILES = "files"
    POSTGRES = "postgres"


HEADER_NAME = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]{1,64}$")
"""An HTTP header name (RFC 9110 token), at most 64 characters."""


def _env(*names: str) -> Any:
    return AliasChoices(*names)


DEFAULT_OFFLOAD_THRESHOLD = 8000
DEFAULT_TOOL_TIMEOUT = 120.0
DEFAULT_LLM_TIMEOUT = 120.0


class HarnessSettings(BaseSettings):
    """All harness configuration. Construct it with keyword arguments to override the environment.

    Example:
        ```python
        settings = HarnessSettings(enabled=True, workspace_root="/srv/agents")
        app.include_router(create_harness_router(settings))
        ```
    """

    model_config = SettingsConfigDict(
        env_file=None,
        extra="ignore",
        env_ignore_empty=True,
        validate_by_name=True,
        validate_by_alias=True,
        frozen=True,
    )

    enabled: bool | None = Field(None, validation_alias=_env("ATMOSPHERE_AI_HARNESS_ENABLED"))
    """Tri-state app-wide flag: unset, `true`, or anything else = kill switch."""

    exclude_paths: Annotated[frozenset[str], NoDecode] = Field(
        frozenset(), validation_alias=_env("ATMOSPHERE_AI_HARNESS_EXCLUDE_PATHS")
    )
    """Exact endpoint paths the harness skips."""

    compaction: Compaction = Field(
        Compaction.SLIDING_WINDOW, validation_alias=_env("ATMOSPHERE_AI_HARNESS_COMPACTION")
    )
    compaction_recent_window: int = Field(
        6, ge=1, validation_alias=_env("ATMOSPHERE_AI_HARNESS_COMPACTION_RECENT_WINDOW")
    )
    """Messages `summarizing` keeps verbatim after its summary."""
    context_window_tokens: int = Field(
        128_000, ge=256, validation_alias=_env("ATMOSPHERE_AI_CONTEXT_WINDOW_TOKENS")
    )
    """The history budget of `token-window` compaction (tokens estimated as chars/4).

    Set explicitly (argument or environment), it always applies. Unset, the budget is the model's
    context window when the runtime knows it (`runtimes.windows.MODEL_CONTEXT_WINDOWS`), and this
    default otherwise (see `memory.compaction.token_budget`)."""
    conversation_idle_timeout: float = Field(
        1800.0, validation_alias=_env("ATMOSPHERE_AI_CONVERSATION_IDLE_TIMEOUT")
    )
    """Seconds without a prompt after which a conversation closes; `<= 0` disables the reaper."""
    conversation_ttl: float | None = Field(
        None, gt=0, validation_alias=_env("ATMOSPHERE_AI_CONVERSATION_TTL")
    )
    """Seconds without a prompt after which a conversation is deleted, its facts extracted
    first (`kernel.retention`); unset keeps conversations."""
    memory_model_timeout: float = Field(
        30.0, gt=0, validation_alias=_env("ATMOSPHERE_AI_MEMORY_MODEL_TIMEOUT")
    )
    """Seconds a summary or fact-extraction model call may take before it fails open."""
    memory_max_facts: int = Field(
        100, ge=1, validation_alias=_env("ATMOSPHERE_AI_MEMORY_MAX_FACTS")
    )
    """Facts the default long-term memory keeps per user (the oldest are evicted)."""
    prompt_cache_default: PromptCache | None = Field(
        None, validation_alias=_env("ATMOSPHERE_AI_HARNESS_PROMPT_CACHE_DEFAULT")
    )
    planning: SurfaceMode = Field(
        SurfaceMode.AUTO, validation_alias=_env("ATMOSPHERE_AI_PLANNING", "LLM_PLANNING")
    )
    filesystem: SurfaceMode = Field(
        SurfaceMode.AUTO, validation_alias=_env("ATMOSPHERE_AI_FILESYSTEM", "LLM_FILESYSTEM")
    )
    filesystem_routes: Annotated[tuple[tuple[str, str], ...], NoDecode] = Field(
        (), validation_alias=_env("ATMOSPHERE_AI_FILESYSTEM_ROUTES", "LLM_FILESYSTEM_ROUTES")
    )
    """`(prefix, directory)` pairs, from `memory/=/var/a,shared/=/var/b`."""

    filesystem_limits: FileSystemLimits = Field(
        FileSystemLimits(), validation_alias=_env("ATMOSPHERE_AI_FILESYSTEM_LIMITS")
    )
    """Bounds of every workspace and route backend; JSON in the environment, e.g.
    `{"max_file_bytes": 1048576, "max_files": 1000}` (unnamed bounds keep their defaults)."""

    usage_limits: UsageLimits = Field(
        UsageLimits(), validation_alias=_env("ATMOSPHERE_AI_USAGE_LIMITS")
    )
    """What one top-level run may spend unless its agent declares `usage_limits=`; JSON in the
    environment, e.g. `{"request_limit": 20, "total_tokens_limit": 200000}` (unnamed limits
    stay unbounded)."""

    user_daily_token_limit: int | None = Field(
        None, ge=1, validation_alias=_env("ATMOSPHERE_AI_USER_DAILY_TOKEN_LIMIT")
    )
    """Tokens (input + output) one user's runs may spend per UTC day, counted where every
    replica sees it (the state backend); unset: no cap."""

    filesystem_fsync: bool = Field(False, validation_alias=_env("ATMOSPHERE_AI_FILESYSTEM_FSYNC"))
    """Flush every workspace write to disk before it returns (durable across power loss, ~1 ms)."""

    skills_dirs: Annotated[tuple[Path, ...], NoDecode] = Field(
        (), validation_alias=_env("ATMOSPHERE_AI_SKILLS_DIRS")
    )
    """App-wide skill folders (comma list), each a folder of `SKILL.md` skill folders; the
    strongest source: they override an agent's own skills of the same name (`docs/skills.md`)."""

    tool_output_offload_threshold: int = Field(
        DEFAULT_OFFLOAD_THRESHOLD,
        validation_alias=_env(
            "ATMOSPHERE_AI_TOOL_OUTPUT_OFFLOAD_THRESHOLD", "LLM_TOOL_OUTPUT_OFFLOAD_THRESHOLD"
        ),
    )
    """Characters; a result longer than this is offloaded to the workspace. `<= 0` disables."""

    tool_execution_timeout: float = Field(
        DEFAULT_TOOL_TIMEOUT,
        validation_alias=_env("ATMOSPHERE_AI_TOOL_EXECUTION_TIMEOUT", "LLM_TOOL_EXECUTION_TIMEOUT"),
    )
    """Seconds one tool call may run before it is cancelled."""

    mcp_connect_timeout: float = Field(
        30.0, gt=0, allow_inf_nan=False, validation_alias=_env("ATMOSPHERE_AI_MCP_CONNECT_TIMEOUT")
    )
    """Seconds an MCP server may take to start and answer its handshake (at start-up, and on a
    restart, which a tool call's own deadline also bounds)."""

    max_tool_rounds: int = Field(50, ge=1, validation_alias=_env("ATMOSPHERE_AI_MAX_TOOL_ROUNDS"))
    """Model turns one prompt may take before the loop stops it."""

    max_tool_calls_per_message: int = Field(
        DEFAULT_MAX_TOOL_CALLS,
        ge=1,
        validation_alias=_env("ATMOSPHERE_AI_MAX_TOOL_CALLS_PER_MESSAGE"),
    )
    """Tool calls one model message may ask for; a message with more runs none of them and the
    model is told to send them in smaller batches (a flood never reaches the stream or history)."""

    max_tool_argument_chars: int = Field(
        DEFAULT_MAX_ARGUMENT_CHARS,
        ge=1024,
        validation_alias=_env("ATMOSPHERE_AI_MAX_TOOL_ARGUMENT_CHARS"),
    )
    """Characters one tool call's arguments may hold; a larger call does not run and its
    arguments are not kept in the history (the model is told to send less per call)."""

    approval_timeout: float = Field(
        300.0, gt=0, allow_inf_nan=False, validation_alias=_env("ATMOSPHERE_AI_APPROVAL_TIMEOUT")
    )
    """Seconds a tool call waits for `POST P/approvals/{id}` before it answers `Approval timed
    out`."""

    subagent_max_depth: int = Field(
        2, ge=0, le=8, validation_alias=_env("ATMOSPHERE_AI_SUBAGENT_MAX_DEPTH")
    )
    """How deep `task` sub-agents may nest (a sub-agent at this depth gets no `task` tool)."""
    subagent_max_spawns: int = Field(
        8, ge=0, le=1000, validation_alias=_env("ATMOSPHERE_AI_SUBAGENT_MAX_SPAWNS")
    )
    """`task` spawns one request may make, nested ones included."""
    subagent_timeout: float = Field(
        120.0, gt=0, allow_inf_nan=False, validation_alias=_env("ATMOSPHERE_AI_SUBAGENT_TIMEOUT")
    )
    """Seconds one `task` sub-agent may run before it is cancelled."""
    subagent_workspace_dir: Path | None = Field(
        None, validation_alias=_env("ATMOSPHERE_AI_SUBAGENT_WORKSPACE_DIR")
    )
    """Where per-spawn temporary workspaces are created; unset = the system temp directory."""

    workspace_root: Path = Field(
        Path("~/.atmosphere/workspace"), validation_alias=_env("ATMOSPHERE_WORKSPACE_ROOT")
    )
    prompt_cache_key: PromptCacheKeyMode = Field(
        PromptCacheKeyMode.AUTO,
        validation_alias=_env("ATMOSPHERE_AI_PROMPT_CACHE_KEY", "LLM_PROMPT_CACHE_KEY"),
    )
    durable_runs: bool | None = Field(
        None, validation_alias=_env("ATMOSPHERE_DURABLE_RUNS_ENABLED")
    )
    durable_runs_keep_seconds: float = Field(
        600.0,
        ge=0,
        allow_inf_nan=False,
        validation_alias=_env("ATMOSPHERE_DURABLE_RUNS_KEEP_SECONDS"),
    )
    """How long a finished durable run's record stays in the journal (its frames and
    checkpoints go as soon as it finishes; see `docs/durable-runs.md`)."""
    durable_runs_lease_seconds: float = Field(
        15.0,
        gt=0.5,
        le=3600,
        allow_inf_nan=False,
        validation_alias=_env("ATMOSPHERE_DURABLE_RUNS_LEASE_SECONDS"),
    )
    """How long a process may go silent before another takes over its unfinished durable
    runs (a dead process on the same host is noticed at once)."""
    tracing: bool = Field(True, validation_alias=_env("ATMOSPHERE_AI_TRACING"))
    """Trace every run with OpenTelemetry when `opentelemetry-api` is installed (extra
    `[otel]`); `false` turns it off (see `docs/tracing.md`)."""
    tracing_capture_content: bool = Field(
        False, validation_alias=_env("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT")
    )
    """Record messages and tool arguments and results on the spans (OpenTelemetry's own
    switch; only `true` turns it on)."""

    llm_runtime: RuntimeChoice = Field(RuntimeChoice.AUTO, validation_alias=_env("LLM_RUNTIME"))
    llm_model: str | None = Field(None, validation_alias=_env("LLM_MODEL"))
    llm_base_url: str | None = Field(None, validation_alias=_env("LLM_BASE_URL"))
    llm_api_key: str | None = Field(None, validation_alias=_env("LLM_API_KEY"), repr=False)
    llm_max_retries: int = Field(2, ge=0, le=10, validation_alias=_env("LLM_MAX_RETRIES"))
    """Retries of a model call on 408/409/429/5xx and connection errors, with the SDK's backoff."""

    llm_timeout: float = Field(
        DEFAULT_LLM_TIMEOUT, gt=0, allow_inf_nan=False, validation_alias=_env("LLM_TIMEOUT")
    )
    """Seconds a model call may wait to connect, or between two streamed chunks."""

    llm_max_tokens: int | None = Field(None, ge=1, validation_alias=_env("LLM_MAX_TOKENS"))
    """Output-token cap per model turn (Anthropic requires one: 8192 when unset)."""

    admin_token: str | None = Field(
        None, validation_alias=_env("ATMOSPHERE_ADMIN_TOKEN"), repr=False
    )
    admin_http_read_auth_required: bool = Field(
        False, validation_alias=_env("ATMOSPHERE_ADMIN_HTTP_READ_AUTH_REQUIRED")
    )
    max_request_bytes: int = Field(
        DEFAULT_MAX_REQUEST_BYTES, ge=1024, validation_alias=_env("ATMOSPHERE_MAX_REQUEST_BYTES")
    )
    """Bytes one request body to a harness `POST` route may hold; a larger one is answered 413
    before it is parsed (a chunked body is cut off as soon as it passes the limit)."""
    websocket_allowed_origins: Annotated[frozenset[str], NoDecode] = Field(
        frozenset(), validation_alias=_env("ATMOSPHERE_WEBSOCKET_ALLOWED_ORIGINS")
    )
    """Browser origins (`https://app.example.com`) that may open `P/ws` besides the app's own;
    `*` allows any. Browsers apply no CORS to WebSockets, so this is what stops another site's
    page from talking to an agent with its visitor's cookies."""

    user_id_header: str | None = Field(None, validation_alias=_env("ATMOSPHERE_USER_ID_HEADER"))
    """A request header that names the user (e.g. `X-Forwarded-User`), set by an auth proxy in
    front of the app; unset = anonymous requests (no long-term memory). Trust it only behind a
    proxy that removes the header from what clients send and sets it itself."""

    config_file: Path | None = Field(None, validation_alias=_env(CONFIG_FILE_ENV))
    """A YAML (`.yml`, `.yaml`), `.properties` or TOML file of settings under Atmosphere's keys
    (`atmosphere.ai.harness.enabled`, ...), read below the environment (see `config_file`
    module). Only the constructor and the environment can name it; no part of the harness reads
    it afterwards, so it belongs to no group."""

    redis_url: str | None = Field(None, validation_alias=_env("ATMOSPHERE_REDIS_URL"), repr=False)
    postgres_url: str | None = Field(
        None, validation_alias=_env("ATMOSPHERE_POSTGRES_URL"), repr=False
    )
    workspace_backend: WorkspaceBackend = Field(
        WorkspaceBackend.FILES, validation_alias=_env("ATMOSPHERE_AI_WORKSPACE_BACKEND")
    )
    """Where conversation workspaces (and Claude's `/memories`) live: `files` under
    `workspace_root`, or `postgres` rows (needs `postgres_url`; replicas need no shared volume)."""

    # --- sources ----------------------------------------------------------------------------

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Constructor > environment (> an opted-in `.env`) > ATMOSPHERE_CONFIG_FILE > defaults."""
        path = _config_file_path(init_settings, env_settings)
        if path is None:
            return init_settings, env_settings, dotenv_settings, file_secret_settings
        file_settings = ConfigFileSettingsSource(settings_cls, path)
        return init_settings, env_settings, dotenv_settings, file_settings, file_secret_settings

    # --- validators -------------------------------------------------------------------------

    @field_validator("enabled", mode="before")
    @classmethod
    def _parse_enabled(cls, value: object) -> bool | None:
        if value is None or isinstance(value, bool):
            return value
        text = str(value).strip()
        if not text:
            return None
        if text.lower() == "true":
            return True
        if text.lower() != "false":
            log.warning(
                "unrecognized harness flag value, treating it as the kill switch (fail-closed); "
                "use true or false",
                value=text,
                setting="ATMOSPHERE_AI_HARNESS_ENABLED",
            )
        return False

    @field_validator("tracing_capture_content", mode="before")
    @classmethod
    def _parse_capture(cls, value: object) -> bool:
        # OpenTelemetry's convention: only `true` (any case) turns it on; never a start-up error.
        return value is True or (isinstance(value, str) and value.strip().lower() == "true")

    @field_validator("exclude_paths", "websocket_allowed_origins", mode="before")
    @classmethod
    def _parse_paths(cls, value: object) -> object:
        if isinstance(value, str):
            value = value.split(",")
        if isinstance(value, list | tuple | set | frozenset):
            return frozenset(str(item).strip() for item in value if str(item).strip())
        return value

    @field_validator("skills_dirs", mode="before")
    @classmethod
    def _parse_skills_dirs(cls, value: object) -> object:
        if value is None:
            return ()
        if isinstance(value, str | Path):
            value = str(value).split(",")
        if isinstance(value, list | tuple):
            return tuple(Path(str(item).strip()) for item in value if str(item).strip())
        return value

    @field_validator("user_id_header", mode="before")
    @classmethod
    def _parse_header_name(cls, value: object) -> object:
        if value is None:
            return None
        text = str(value).strip()
        if not text:
            return None
        if not HEADER_NAME.match(text):
            raise ValueError(
                "ATMOSPHERE_USER_ID_HEADER must be an HTTP header name (letters, digits and "
                f"!#$%&'*+-.^_`|~, at most 64), e.g. X-Forwarded-User; got {text[:80]!r}"
            )
        return text

    @field_validator("compaction", mode="before")
    @classmethod
    def _parse_compaction(cls, value: object) -> object:
        if isinstance(value, Compaction) or value is None:
            return value or Compaction.SLIDING_WINDOW
        text = str(value).strip().lower()
        try:
            return Compaction(text or Compaction.SLIDING_WINDOW.value)
        except ValueError:
            log.warning("unknown compaction strategy, using sliding-window", value=value)
            return Compaction.SLIDING_WINDOW

    @field_validator("prompt_cache_default", mode="before")
    @classmethod
    def _parse_cache_default(cls, value: object) -> object:
        if value is None or isinstance(value, PromptCache):
            return value
        policy = PromptCache.parse(str(value))
        if policy is None:
            log.warning("unknown prompt-cache default, ignoring it", value=value)
        return policy

    @field_validator("planning", "filesystem", mode="before")
    @classmethod
    def _parse_mode(cls, value: object) -> SurfaceMode:
        return SurfaceMode.parse(value)

    @field_validator("prompt_cache_key", mode="before")
    @classmethod
    def _parse_key_mode(cls, value: object) -> PromptCacheKeyMode:
        return PromptCacheKeyMode.parse(value)

    @field_validator("llm_runtime", mode="before")
    @classmethod
    def _parse_runtime(cls, value: object) -> object:
        if isinstance(value, RuntimeChoice) or value is None:
            return value or RuntimeChoice.AUTO
        text = str(value).strip().lower() or "auto"
        try:
            return RuntimeChoice(text)
        except ValueError:
            choices = ", ".join(choice.value for choice in RuntimeChoice)
            raise ValueError(f"LLM_RUNTIME must be one of {choices}, got {value!r}") from None

    @field_validator("workspace_backend", mode="before")
    @classmethod
    def _parse_workspace_backend(cls, value: object) -> object:
        if value is None or isinstance(value, WorkspaceBackend):
            return value or WorkspaceBackend.FILES
        text = str(value).strip().lower() or WorkspaceBackend.FILES.value
        try:
            return WorkspaceBackend(text)
        except ValueError:
            choices = ", ".join(choice.value for choice in WorkspaceBackend)
            raise ValueError(
                f"ATMOSPHERE_AI_WORKSPACE_BACKEND must be one of {choices}, got {value!r}"
            ) from None

    @field_validator("filesystem_routes", mode="before")
    @classmethod
    def _parse_routes(cls, value: object) -> object:
        if value is None:
            return ()
        if isinstance(value, dict):
            return tuple((str(k), str(v)) for k, v in value.items())
        if not isinstance(value, str):
            return value
        routes: list[tuple[str, str]] = []
        for raw in value.split(","):
            entry = raw.strip()
            if not entry:
                continue
            prefix, sep, directory = entry.partition("=")
            if not sep or not prefix.strip() or not directory.strip():
                raise ValueError(
                    f"malformed filesystem route {entry!r}: expected prefix=directory, "
                    "e.g. memory/=/var/agent-memory"
                )
            routes.append((prefix.strip(), directory.strip()))
        return tuple(routes)

    @field_validator("tool_output_offload_threshold", mode="before")
    @classmethod
    def _parse_threshold(cls, value: object) -> object:
        if isinstance(value, int):
            return value
        try:
            return int(str(value).strip())
        except ValueError:
            log.warning("malformed offload threshold, using the default", value=value)
            return DEFAULT_OFFLOAD_THRESHOLD

    @field_validator("tool_execution_timeout", mode="before")
    @classmethod
    def _parse_timeout(cls, value: object) -> object:
        try:
            seconds = float(str(value).strip())
        except ValueError:
            seconds = -1.0
        if seconds <= 0:
            log.warning("tool execution timeout must be a positive number of seconds", value=value)
            return DEFAULT_TOOL_TIMEOUT
        return seconds

    @field_validator("usage_limits", mode="before")
    @classmethod
    def _check_usage_keys(cls, value: object) -> object:
        if isinstance(value, Mapping):
            unknown = sorted(set(value) - set(UsageLimits.__slots__))
            if unknown:
                raise ValueError(
                    f"ATMOSPHERE_AI_USAGE_LIMITS: unknown keys {unknown}; known: "
                    + ", ".join(UsageLimits.__slots__)
                )
        return value

    @field_validator("workspace_root", mode="after")
    @classmethod
    def _expand_root(cls, value: Path) -> Path:
        return value.expanduser()

    # --- derived ----------------------------------------------------------------------------

    @cached_property
    def groups(self) -> SettingsGroups:
        """The settings by concern, so each part of the harness reads only its own group.

        The flat fields stay the public way to set them (constructor arguments and environment
        names are fixed); the groups are read-only views built from them once.
        """
        return SettingsGroups(
            harness=HarnessSwitchSettings(
                enabled=self.enabled,
                exclude_paths=self.exclude_paths,
                prompt_cache_default=self.prompt_cache_default,
            ),
            planning=PlanningSettings(mode=self.planning),
            skills=SkillsSettings(dirs=self.skills_dirs),
            mcp=MCPSettings(connect_timeout=self.mcp_connect_timeout),
            filesystem=FilesystemSettings(
                mode=self.filesystem,
                routes=self.filesystem_routes,
                limits=self.filesystem_limits,
                fsync=self.filesystem_fsync,
                offload_threshold=self.tool_output_offload_threshold,
                workspace_root=self.workspace_root,
            ),
            memory=MemorySettings(
                compaction=self.compaction,
                recent_window=self.compaction_recent_window,
                context_window_tokens=self.context_window_tokens,
                idle_timeout=self.conversation_idle_timeout,
                conversation_ttl=self.conversation_ttl,
                model_timeout=self.memory_model_timeout,
                max_facts=self.memory_max_facts,
            ),
            delegation=DelegationSettings(
                max_depth=self.subagent_max_depth,
                max_spawns=self.subagent_max_spawns,
                timeout=self.subagent_timeout,
                workspace_dir=self.subagent_workspace_dir,
            ),
            runtime=RuntimeSettings(
                choice=self.llm_runtime,
                model=self.llm_model,
                base_url=self.llm_base_url,
                api_key=self.llm_api_key,
                max_retries=self.llm_max_retries,
                timeout=self.llm_timeout,
                max_tokens=self.llm_max_tokens,
                prompt_cache_key=self.prompt_cache_key,
                tool_execution_timeout=self.tool_execution_timeout,
                max_tool_rounds=self.max_tool_rounds,
                max_tool_calls_per_message=self.max_tool_calls_per_message,
                max_tool_argument_chars=self.max_tool_argument_chars,
                approval_timeout=self.approval_timeout,
            ),
            usage=UsageSettings(
                limits=self.usage_limits, user_daily_token_limit=self.user_daily_token_limit
            ),
            admin=AdminSettings(
                token=self.admin_token,
                read_auth_required=self.admin_http_read_auth_required,
                websocket_allowed_origins=self.websocket_allowed_origins,
                max_request_bytes=self.max_request_bytes,
                user_id_header=self.user_id_header,
            ),
            backends=BackendSettings(
                redis_url=self.redis_url,
                postgres_url=self.postgres_url,
                workspace_backend=self.workspace_backend,
                durable_runs=self.durable_runs_effective,
                durable_runs_keep_seconds=self.durable_runs_keep_seconds,
                durable_runs_lease_seconds=self.durable_runs_lease_seconds,
            ),
            tracing=TracingSettings(
                enabled=self.tracing, capture_content=self.tracing_capture_content
            ),
        )

    @property
    def kill_switch(self) -> bool:
        """True when the app-wide flag is present and not literally `true`."""
        return self.enabled is False

    @property
    def durable_runs_effective(self) -> bool:
        """Durable runs: explicit value wins; otherwise implied by an explicit `enabled=true`."""
        if self.durable_runs is not None:
            return self.durable_runs
        return self.enabled is True


def _config_file_path(
    init_settings: PydanticBaseSettingsSource, env_settings: PydanticBaseSettingsSource
) -> Path | None:
    """`config_file` as the constructor or, failing that, the environment gives it."""
    given = getattr(init_settings, "init_kwargs", {}).get(CONFIG_FILE_ENV)
    if given is None:
        env_vars = getattr(env_settings, "env_vars", {})
        given = env_vars.get(CONFIG_FILE_ENV, env_vars.get(CONFIG_FILE_ENV.lower()))
    if given is None or not str(given).strip():
        return None
    return Path(str(given).strip())


# --- groups -------------------------------------------------------------------------------------

_GROUP = ConfigDict(frozen=True, arbitrary_types_allowed=True)


class HarnessSwitchSettings(BaseModel):
    """Which endpoints are harnessed: the app-wide flag, excluded paths, the cache default."""

    model_config = _GROUP
    enabled: bool | None
    exclude_paths: frozenset[str]
    prompt_cache_default: PromptCache | None

    @property
    def kill_switch(self) -> bool:
        """True when the app-wide flag is present and not literally `true`."""
        return self.enabled is False


class PlanningSettings(BaseModel):
    """The plan surface: built-in `write_todos`, the runtime's native one, or `auto`."""

    model_config = _GROUP
    mode: SurfaceMode


class SkillsSettings(BaseModel):
    """App-wide skill folders (they override an agent's own skills of the same name)."""

    model_config = _GROUP
    dirs: tuple[Path, ...]


class MCPSettings(BaseModel):
    """MCP tool servers: how long one may take to start and answer its handshake."""

    model_config = _GROUP
    connect_timeout: float


class FilesystemSettings(BaseModel):
    """The workspace: surface mode, composite routes, bounds, durability, offload."""

    model_config = _GROUP
    mode: SurfaceMode
    routes: tuple[tuple[str, str], ...]
    limits: FileSystemLimits
    fsync: bool
    offload_threshold: int
    workspace_root: Path


class MemorySettings(BaseModel):
    """Conversation memory (compaction, idle close, retention) and long-term memory
    extraction."""

    model_config = _GROUP
    compaction: Compaction
    recent_window: int
    context_window_tokens: int
    idle_timeout: float
    conversation_ttl: float | None
    model_timeout: float
    max_facts: int


class DelegationSettings(BaseModel):
    """`task` sub-agents: nesting depth, spawns per request, time, where their workspaces go."""

    model_config = _GROUP
    max_depth: int
    max_spawns: int
    timeout: float
    workspace_dir: Path | None


class RuntimeSettings(BaseModel):
    """The model runtime and the loop's bounds around it."""

    model_config = _GROUP
    choice: RuntimeChoice
    model: str | None
    base_url: str | None
    api_key: str | None = Field(repr=False)
    max_retries: int
    timeout: float
    max_tokens: int | None
    prompt_cache_key: PromptCacheKeyMode
    tool_execution_timeout: float
    max_tool_rounds: int
    max_tool_calls_per_message: int
    max_tool_argument_chars: int
    approval_timeout: float


class UsageSettings(BaseModel):
    """What a run may spend on its model (requests, tokens, tool calls), app-wide."""

    model_config = _GROUP
    limits: UsageLimits
    user_daily_token_limit: int | None


class AdminSettings(BaseModel):
    """The HTTP surface: admin REST, the WebSocket origin check, the request-body bound, and
    the trusted header that names the user."""

    model_config = _GROUP
    token: str | None = Field(repr=False)
    read_auth_required: bool
    websocket_allowed_origins: frozenset[str]
    max_request_bytes: int
    user_id_header: str | None


class BackendSettings(BaseModel):
    """Where shared state lives (`backends.resolve_backends` reads this group)."""

    model_config = _GROUP
    redis_url: str | None = Field(repr=False)
    postgres_url: str | None = Field(repr=False)
    workspace_backend: WorkspaceBackend
    durable_runs: bool
    durable_runs_keep_seconds: float
    durable_runs_lease_seconds: float


class TracingSettings(BaseModel):
    """OpenTelemetry tracing and metrics: on or off, and whether contents are recorded."""

    model_config = _GROUP
    enabled: bool
    capture_content: bool


class SettingsGroups(BaseModel):
    """`HarnessSettings.groups`: every setting, by the part of the harness that reads it."""

    model_config = _GROUP
    harness: HarnessSwitchSettings
    planning: PlanningSettings
    skills: SkillsSettings
    mcp: MCPSettings
    filesystem: FilesystemSettings
    memory: MemorySettings
    delegation: DelegationSettings
    runtime: RuntimeSettings
    usage: UsageSettings
    admin: AdminSettings
    backends: BackendSettings
    tracing: TracingSettings
