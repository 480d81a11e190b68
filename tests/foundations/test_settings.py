"""HarnessSettings: every key's env names, precedence, and lenient parsing."""

from __future__ import annotations

import ast
import inspect
import logging
import re
import textwrap
from pathlib import Path

import pytest
from pydantic import ValidationError

from atmosphere_harness import FileSystemLimits, HarnessSettings, PromptCache, UsageLimits
from atmosphere_harness._settings import (
    Compaction,
    PromptCacheKeyMode,
    RuntimeChoice,
    SettingsGroups,
    SurfaceMode,
    WorkspaceBackend,
)

# (field, primary env, fallback env or None, env value, expected parsed, programmatic value)
KEYS = [
    ("exclude_paths", "ATMOSPHERE_AI_HARNESS_EXCLUDE_PATHS", None, "/a, /b", {"/a", "/b"}, {"/c"}),
    (
        "compaction",
        "ATMOSPHERE_AI_HARNESS_COMPACTION",
        None,
        "summarizing",
        Compaction.SUMMARIZING,
        Compaction.TOKEN_WINDOW,
    ),
    (
        "prompt_cache_default",
        "ATMOSPHERE_AI_HARNESS_PROMPT_CACHE_DEFAULT",
        None,
        "aggressive",
        PromptCache.AGGRESSIVE,
        PromptCache.NONE,
    ),
    (
        "planning",
        "ATMOSPHERE_AI_PLANNING",
        "LLM_PLANNING",
        "builtin",
        SurfaceMode.BUILTIN,
        SurfaceMode.NATIVE,
    ),
    (
        "filesystem",
        "ATMOSPHERE_AI_FILESYSTEM",
        "LLM_FILESYSTEM",
        "native",
        SurfaceMode.NATIVE,
        SurfaceMode.BUILTIN,
    ),
    (
        "filesystem_routes",
        "ATMOSPHERE_AI_FILESYSTEM_ROUTES",
        "LLM_FILESYSTEM_ROUTES",
        "memory/=/var/a,shared/=/var/b",
        (("memory/", "/var/a"), ("shared/", "/var/b")),
        (("x/", "/y"),),
    ),
    (
        "tool_output_offload_threshold",
        "ATMOSPHERE_AI_TOOL_OUTPUT_OFFLOAD_THRESHOLD",
        "LLM_TOOL_OUTPUT_OFFLOAD_THRESHOLD",
        "123",
        123,
        7,
    ),
    (
        "tool_execution_timeout",
        "ATMOSPHERE_AI_TOOL_EXECUTION_TIMEOUT",
        "LLM_TOOL_EXECUTION_TIMEOUT",
        "4.5",
        4.5,
        9.0,
    ),
    (
        "workspace_root",
        "ATMOSPHERE_WORKSPACE_ROOT",
        None,
        "/srv/ws",
        Path("/srv/ws"),
        Path("/other"),
    ),
    (
        "prompt_cache_key",
        "ATMOSPHERE_AI_PROMPT_CACHE_KEY",
        "LLM_PROMPT_CACHE_KEY",
        "yes",
        PromptCacheKeyMode.ENABLED,
        PromptCacheKeyMode.DISABLED,
    ),
    ("durable_runs", "ATMOSPHERE_DURABLE_RUNS_ENABLED", None, "true", True, False),
    ("durable_runs_keep_seconds", "ATMOSPHERE_DURABLE_RUNS_KEEP_SECONDS", None, "60", 60.0, 5.0),
    ("durable_runs_lease_seconds", "ATMOSPHERE_DURABLE_RUNS_LEASE_SECONDS", None, "3", 3.0, 9.0),
    ("tracing", "ATMOSPHERE_AI_TRACING", None, "false", False, True),
    (
        "tracing_capture_content",
        "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT",
        None,
        "TRUE",
        True,
        False,
    ),
    ("llm_runtime", "LLM_RUNTIME", None, "scripted", RuntimeChoice.SCRIPTED, RuntimeChoice.AUTO),
    ("llm_model", "LLM_MODEL", None, "gpt-x", "gpt-x", "other"),
    (
        "llm_base_url",
        "LLM_BASE_URL",
        None,
        "http://localhost:11434/v1",
        "http://localhost:11434/v1",
        "http://x",
    ),
    ("llm_api_key", "LLM_API_KEY", None, "sk-1", "sk-1", "sk-2"),
    ("admin_token", "ATMOSPHERE_ADMIN_TOKEN", None, "tok", "tok", "other"),
    (
        "admin_http_read_auth_required",
        "ATMOSPHERE_ADMIN_HTTP_READ_AUTH_REQUIRED",
        None,
        "true",
        True,
        False,
    ),
    (
        "redis_url",
        "ATMOSPHERE_REDIS_URL",
        None,
        "redis://127.0.0.1:6379/0",
        "redis://127.0.0.1:6379/0",
        "redis://x",
    ),
    (
        "postgres_url",
        "ATMOSPHERE_POSTGRES_URL",
        None,
        "postgresql://127.0.0.1/test",
        "postgresql://127.0.0.1/test",
        "postgresql://x",
    ),
    (
        "workspace_backend",
        "ATMOSPHERE_AI_WORKSPACE_BACKEND",
        None,
        "postgres",
        WorkspaceBackend.POSTGRES,
        WorkspaceBackend.FILES,
    ),
    ("max_tool_rounds", "ATMOSPHERE_AI_MAX_TOOL_ROUNDS", None, "7", 7, 3),
    ("max_tool_calls_per_message", "ATMOSPHERE_AI_MAX_TOOL_CALLS_PER_MESSAGE", None, "9", 9, 4),
    ("max_tool_argument_chars", "ATMOSPHERE_AI_MAX_TOOL_ARGUMENT_CHARS", None, "4096", 4096, 2048),
    ("max_request_bytes", "ATMOSPHERE_MAX_REQUEST_BYTES", None, "65536", 65536, 2048),
    (
        "user_daily_token_limit",
        "ATMOSPHERE_AI_USER_DAILY_TOKEN_LIMIT",
        None,
        "500000",
        500000,
        1000,
    ),
    # The tri-state flag: a programmatic True beats an env kill switch, and the reverse.
    ("enabled", "ATMOSPHERE_AI_HARNESS_ENABLED", None, "false", False, True),
    ("compaction_recent_window", "ATMOSPHERE_AI_HARNESS_COMPACTION_RECENT_WINDOW", None, "9", 9, 3),
    ("context_window_tokens", "ATMOSPHERE_AI_CONTEXT_WINDOW_TOKENS", None, "4096", 4096, 8192),
    ("conversation_idle_timeout", "ATMOSPHERE_AI_CONVERSATION_IDLE_TIMEOUT", None, "60", 60.0, 0.0),
    ("conversation_ttl", "ATMOSPHERE_AI_CONVERSATION_TTL", None, "86400", 86400.0, 60.0),
    ("memory_model_timeout", "ATMOSPHERE_AI_MEMORY_MODEL_TIMEOUT", None, "2.5", 2.5, 7.0),
    ("memory_max_facts", "ATMOSPHERE_AI_MEMORY_MAX_FACTS", None, "12", 12, 34),
    ("filesystem_fsync", "ATMOSPHERE_AI_FILESYSTEM_FSYNC", None, "true", True, False),
    ("approval_timeout", "ATMOSPHERE_AI_APPROVAL_TIMEOUT", None, "30", 30.0, 5.0),
    ("subagent_max_depth", "ATMOSPHERE_AI_SUBAGENT_MAX_DEPTH", None, "1", 1, 3),
    ("subagent_max_spawns", "ATMOSPHERE_AI_SUBAGENT_MAX_SPAWNS", None, "3", 3, 5),
    ("subagent_timeout", "ATMOSPHERE_AI_SUBAGENT_TIMEOUT", None, "12", 12.0, 34.0),
    (
        "subagent_workspace_dir",
        "ATMOSPHERE_AI_SUBAGENT_WORKSPACE_DIR",
        None,
        "/srv/spawns",
        Path("/srv/spawns"),
        Path("/other"),
    ),
    (
        "skills_dirs",
        "ATMOSPHERE_AI_SKILLS_DIRS",
        None,
        "/srv/skills, ,/opt/team-skills",
        (Path("/srv/skills"), Path("/opt/team-skills")),
        (Path("/other"),),
    ),
    ("mcp_connect_timeout", "ATMOSPHERE_AI_MCP_CONNECT_TIMEOUT", None, "4.5", 4.5, 9.0),
    ("llm_max_retries", "LLM_MAX_RETRIES", None, "5", 5, 0),
    ("llm_timeout", "LLM_TIMEOUT", None, "15", 15.0, 40.0),
    ("llm_max_tokens", "LLM_MAX_TOKENS", None, "1024", 1024, 2048),
    (
        "user_id_header",
        "ATMOSPHERE_USER_ID_HEADER",
        None,
        " X-Forwarded-User ",
        "X-Forwarded-User",
        "X-Auth-Request-User",
    ),
    (
        "websocket_allowed_origins",
        "ATMOSPHERE_WEBSOCKET_ALLOWED_ORIGINS",
        None,
        "https://a.example, https://b.example",
        {"https://a.example", "https://b.example"},
        {"https://c.example"},
    ),
]


def _value(settings: HarnessSettings, field: str) -> object:
    value = getattr(settings, field)
    return set(value) if isinstance(value, frozenset) else value


@pytest.mark.parametrize(("field", "env", "fallback", "raw", "parsed", "given"), KEYS)
def test_env_is_read_and_argument_wins(
    monkeypatch: pytest.MonkeyPatch, field, env, fallback, raw, parsed, given
) -> None:
    monkeypatch.setenv(env, raw)
    assert _value(HarnessSettings(), field) == parsed
    assert _value(HarnessSettings(**{field: given}), field) == (
        set(given) if isinstance(given, set) else given
    )


@pytest.mark.parametrize(
    ("field", "env", "fallback", "raw", "parsed", "given"), [k for k in KEYS if k[2]]
)
def test_atmosphere_name_beats_llm_fallback(
    monkeypatch: pytest.MonkeyPatch, field, env, fallback, raw, parsed, given
) -> None:
    monkeypatch.setenv(fallback, raw)
    assert _value(HarnessSettings(), field) == parsed, "fallback alone is read"
    default = _value(HarnessSettings.model_construct(), field)
    monkeypatch.setenv(
        env, "garbage-that-parses-to-default" if field != "filesystem_routes" else ""
    )
    if field == "filesystem_routes":
        monkeypatch.setenv(env, "only/=/here")
        assert _value(HarnessSettings(), field) == (("only/", "/here"),)
    else:
        # the ATMOSPHERE_ name is read first: its (unparseable -> default) value wins
        assert _value(HarnessSettings(), field) == default


def test_defaults() -> None:
    settings = HarnessSettings()
    assert settings.enabled is None
    assert settings.exclude_paths == frozenset()
    assert settings.compaction is Compaction.SLIDING_WINDOW
    assert settings.prompt_cache_default is None
    assert settings.planning is SurfaceMode.AUTO
    assert settings.filesystem is SurfaceMode.AUTO
    assert settings.filesystem_routes == ()
    assert settings.tool_output_offload_threshold == 8000
    assert settings.tool_execution_timeout == 120.0
    assert settings.workspace_root == Path("~/.atmosphere/workspace").expanduser()
    assert settings.prompt_cache_key is PromptCacheKeyMode.AUTO
    assert settings.durable_runs is None
    assert settings.llm_runtime is RuntimeChoice.AUTO
    assert settings.admin_token is None
    assert settings.admin_http_read_auth_required is False


@pytest.mark.parametrize(
    ("raw", "expected", "warns"),
    [
        ("true", True, False),
        ("TRUE", True, False),
        (" True ", True, False),
        ("false", False, False),
        ("FALSE", False, False),
        ("yes", False, True),
        ("1", False, True),
        ("on", False, True),
        ("", None, False),
        ("   ", None, False),
    ],
)
def test_enabled_tri_state(monkeypatch, caplog, raw, expected, warns) -> None:
    monkeypatch.setenv("ATMOSPHERE_AI_HARNESS_ENABLED", raw)
    with caplog.at_level(logging.WARNING, logger="atmosphere_harness"):
        settings = HarnessSettings()
    assert settings.enabled is expected
    assert settings.kill_switch is (expected is False)
    warned = [r for r in caplog.records if "kill switch" in r.getMessage()]
    assert bool(warned) is warns
    if warns:
        assert repr(raw.strip()) in warned[0].getMessage(), "the WARN names the value"


def test_enabled_programmatic_values() -> None:
    assert HarnessSettings(enabled=True).enabled is True
    assert HarnessSettings(enabled=False).kill_switch
    assert HarnessSettings(enabled="yes").kill_switch  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("raw", "mode"),
    [
        ("builtin", SurfaceMode.BUILTIN),
        ("BUILT-IN", SurfaceMode.BUILTIN),
        (" Native ", SurfaceMode.NATIVE),
        ("auto", SurfaceMode.AUTO),
        ("whatever", SurfaceMode.AUTO),
    ],
)
def test_mode_knobs_parse_leniently(monkeypatch, raw, mode) -> None:
    monkeypatch.setenv("LLM_PLANNING", raw)
    monkeypatch.setenv("ATMOSPHERE_AI_FILESYSTEM", raw)
    settings = HarnessSettings()
    assert settings.planning is mode
    assert settings.filesystem is mode


def test_exclude_paths_are_trimmed_and_empties_dropped(monkeypatch) -> None:
    monkeypatch.setenv("ATMOSPHERE_AI_HARNESS_EXCLUDE_PATHS", " /a ,,/b , ")
    assert HarnessSettings().exclude_paths == {"/a", "/b"}


@pytest.mark.parametrize("entry", ["nodelimiter", "=/x", "x/=", " = "])
def test_malformed_routes_fail_at_construction(monkeypatch, entry) -> None:
    monkeypatch.setenv("LLM_FILESYSTEM_ROUTES", f"ok/=/tmp/ok,{entry}")
    with pytest.raises(ValidationError, match="malformed filesystem route"):
        HarnessSettings()


def test_unknown_compaction_and_cache_default_warn_and_fall_back(monkeypatch, caplog) -> None:
    monkeypatch.setenv("ATMOSPHERE_AI_HARNESS_COMPACTION", "magic")
    monkeypatch.setenv("ATMOSPHERE_AI_HARNESS_PROMPT_CACHE_DEFAULT", "huge")
    with caplog.at_level(logging.WARNING, logger="atmosphere_harness"):
        settings = HarnessSettings()
    assert settings.compaction is Compaction.SLIDING_WINDOW
    assert settings.prompt_cache_default is None
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 2


def test_malformed_numbers_fall_back_with_a_warning(monkeypatch) -> None:
    monkeypatch.setenv("LLM_TOOL_OUTPUT_OFFLOAD_THRESHOLD", "lots")
    monkeypatch.setenv("LLM_TOOL_EXECUTION_TIMEOUT", "-3")
    settings = HarnessSettings()
    assert settings.tool_output_offload_threshold == 8000
    assert settings.tool_execution_timeout == 120.0
    assert HarnessSettings(tool_output_offload_threshold=0).tool_output_offload_threshold == 0


def test_unknown_runtime_is_a_clear_error(monkeypatch) -> None:
    monkeypatch.setenv("LLM_RUNTIME", "opnai")
    with pytest.raises(ValidationError, match="LLM_RUNTIME must be one of"):
        HarnessSettings()


def test_never_reads_dotenv_implicitly(tmp_path, monkeypatch) -> None:
    (tmp_path / ".env").write_text("ATMOSPHERE_AI_HARNESS_ENABLED=true\nDATABASE_URL=x\n")
    monkeypatch.chdir(tmp_path)
    assert HarnessSettings().enabled is None
    opted_in = HarnessSettings(_env_file=tmp_path / ".env")  # type: ignore[call-arg]
    assert opted_in.enabled is True, "explicit opt-in works and unrelated keys are ignored"


def test_durable_runs_implication() -> None:
    assert HarnessSettings(enabled=True).durable_runs_effective is True
    assert HarnessSettings(enabled=True, durable_runs=False).durable_runs_effective is False
    assert HarnessSettings(enabled=False).durable_runs_effective is False
    assert HarnessSettings().durable_runs_effective is False
    assert HarnessSettings(durable_runs=True).durable_runs_effective is True


def test_secrets_stay_out_of_repr() -> None:
    text = repr(HarnessSettings(llm_api_key="sk-secret", admin_token="tok-secret"))
    assert "sk-secret" not in text
    assert "tok-secret" not in text


def test_every_setting_is_in_the_precedence_table() -> None:
    """A new setting gets a row above (env read, argument wins), or this fails."""
    # filesystem_limits, usage_limits and config_file (tests/foundations/test_config_file.py)
    # have their own
    assert set(HarnessSettings.model_fields) == {key[0] for key in KEYS} | {
        "filesystem_limits",
        "usage_limits",
        "config_file",
    }


def test_filesystem_limits_from_json_and_argument_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(
        "ATMOSPHERE_AI_FILESYSTEM_LIMITS", '{"max_file_bytes": 1024, "max_files": 9}'
    )
    limits = HarnessSettings().filesystem_limits
    assert (limits.max_file_bytes, limits.max_files) == (1024, 9)
    assert limits.max_total_bytes == FileSystemLimits().max_total_bytes, "unnamed bounds default"
    given = FileSystemLimits(max_files=3)
    assert HarnessSettings(filesystem_limits=given).filesystem_limits == given


def test_usage_limits_from_json_and_argument_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    assert HarnessSettings().groups.usage.limits == UsageLimits()
    monkeypatch.setenv("ATMOSPHERE_AI_USAGE_LIMITS", '{"request_limit": 4, "tool_calls_limit": 9}')
    limits = HarnessSettings().groups.usage.limits
    assert (limits.request_limit, limits.tool_calls_limit, limits.total_tokens_limit) == (
        4,
        9,
        None,
    )
    given = UsageLimits(total_tokens_limit=1000)
    assert HarnessSettings(usage_limits=given).groups.usage.limits == given


def test_max_request_bytes_defaults_to_4_mib_and_has_a_floor() -> None:
    assert HarnessSettings().max_request_bytes == 4 * 1024 * 1024
    assert HarnessSettings(max_request_bytes=1024).max_request_bytes == 1024
    assert HarnessSettings(max_request_bytes=2048).groups.admin.max_request_bytes == 2048
    with pytest.raises(ValidationError, match="max_request_bytes"):
        HarnessSettings(max_request_bytes=1023)


def test_user_id_header_is_a_header_name_or_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    assert HarnessSettings().user_id_header is None
    assert HarnessSettings().groups.admin.user_id_header is None
    monkeypatch.setenv("ATMOSPHERE_USER_ID_HEADER", "  ")
    assert HarnessSettings().user_id_header is None, "blank is unset"
    given = HarnessSettings(user_id_header="X-Forwarded-User")
    assert given.groups.admin.user_id_header == "X-Forwarded-User"
    for bad in ("X Forwarded User", "X-User:", "x" * 65, "Ü-User"):
        with pytest.raises(ValidationError, match="ATMOSPHERE_USER_ID_HEADER must be an HTTP"):
            HarnessSettings(user_id_header=bad)


# --- read by concern ----------------------------------------------------------------------------

PACKAGE = Path(__file__).resolve().parents[2] / "atmosphere_harness"
FLAT = set(HarnessSettings.model_fields) | {"kill_switch", "durable_runs_effective"}


def test_every_setting_but_the_config_file_is_in_a_group() -> None:
    """The groups are built from every flat field (the config file is read before they exist)."""
    source = inspect.getsource(HarnessSettings.groups.func)
    read = {
        node.attr
        for node in ast.walk(ast.parse(textwrap.dedent(source)))
        if isinstance(node, ast.Attribute) and getattr(node.value, "id", None) == "self"
    }
    read = {"durable_runs" if name == "durable_runs_effective" else name for name in read}
    assert read == set(HarnessSettings.model_fields) - {"config_file"}


def test_the_package_reads_settings_through_their_groups() -> None:
    """No `settings.<flat field>` outside the settings module: each part reads its group."""
    flat_reads = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "_settings.py" and path.parent == PACKAGE:
            continue
        source = path.read_text(encoding="utf-8")
        tree = ast.parse(source)
        groups = {  # names bound to a group (`settings = host.settings.groups.memory`)
            target.id
            for node in ast.walk(tree)
            if isinstance(node, ast.Assign) and ".groups." in ast.unparse(node.value) + "."
            for target in node.targets
            if isinstance(target, ast.Name)
        }
        for node in ast.walk(tree):
            if not isinstance(node, ast.Attribute) or node.attr not in FLAT:
                continue
            receiver = ast.get_source_segment(source, node.value) or ""
            if receiver in groups:
                continue
            if "settings" in receiver.lower() and "groups" not in receiver:
                flat_reads.append(f"{path.relative_to(PACKAGE)}:{node.lineno}: {node.attr}")
    assert flat_reads == []


def test_the_docs_list_each_group_as_it_is() -> None:
    page = (PACKAGE.parent / "docs" / "configuration.md").read_text(encoding="utf-8")
    documented = {
        group: set(re.findall(r"`(\w+)`", re.sub(r"\([^)]*\)", "", fields)))
        for group, fields in re.findall(r"^\| `groups\.(\w+)` \| (.*) \|$", page, re.MULTILINE)
    }
    declared = {
        group: set(info.annotation.model_fields)
        for group, info in SettingsGroups.model_fields.items()
        if info.annotation is not None
    }
    assert documented == declared


@pytest.mark.parametrize(
    ("value", "captured"),
    [("true", True), (" True ", True), ("1", False), ("yes", False), ("", False)],
)
def test_only_true_records_message_contents(
    monkeypatch: pytest.MonkeyPatch, value: str, captured: bool
) -> None:
    """OpenTelemetry's own switch: anything but `true` leaves contents out, never fails start-up."""
    monkeypatch.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", value)
    assert HarnessSettings().groups.tracing.capture_content is captured
