"""`ATMOSPHERE_CONFIG_FILE`: Atmosphere's keys from YAML, .properties and TOML, below the env."""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

import pytest

from atmosphere_harness import HarnessSettings, PromptCache
from atmosphere_harness._config_file import (
    QUARKUS_DURABLE_OPT_OUT,
    SEED_KEYS,
    UNSUPPORTED,
    parse_properties,
)
from atmosphere_harness._errors import ConfigFileError
from atmosphere_harness._settings import Compaction, PromptCacheKeyMode, SurfaceMode

ROOT = Path(__file__).resolve().parents[2]

# Atmosphere's own examples (its "Configuration Keys" documentation), verbatim.
SPRING_YAML = """\
atmosphere:
  ai:
    harness:
      enabled: true
      exclude-paths:
        - /atmosphere/internal-webhook
      compaction: sliding-window
      prompt-cache-default: conservative
"""
QUARKUS_PROPERTIES = """\
quarkus.atmosphere.ai.harness.enabled=true
quarkus.atmosphere.ai.harness.exclude-paths=/atmosphere/internal-webhook
quarkus.atmosphere.ai.harness.compaction=sliding-window
quarkus.atmosphere.ai.harness.prompt-cache-default=conservative
"""


def config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, text: str | bytes) -> Path:
    """Write the file and point ATMOSPHERE_CONFIG_FILE at it."""
    path = tmp_path / name
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    monkeypatch.setenv("ATMOSPHERE_CONFIG_FILE", str(path))
    return path


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        record.getMessage()
        for record in caplog.records
        if record.levelno == logging.WARNING and record.name == "atmosphere_harness._config_file"
    ]


# --- each format ---------------------------------------------------------------------------


def test_spring_application_yml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config(tmp_path, monkeypatch, "application.yml", SPRING_YAML)
    settings = HarnessSettings()
    assert settings.enabled is True
    assert settings.exclude_paths == {"/atmosphere/internal-webhook"}
    assert settings.compaction is Compaction.SLIDING_WINDOW
    assert settings.prompt_cache_default is PromptCache.CONSERVATIVE
    assert settings.durable_runs_effective is True, "enabled=true implies durable runs"


def test_quarkus_application_properties(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config(tmp_path, monkeypatch, "application.properties", QUARKUS_PROPERTIES)
    settings = HarnessSettings()
    assert settings.enabled is True
    assert settings.exclude_paths == {"/atmosphere/internal-webhook"}
    assert settings.prompt_cache_default is PromptCache.CONSERVATIVE


def test_servlet_init_params_and_system_properties(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config(
        tmp_path,
        monkeypatch,
        "web.properties",
        "org.atmosphere.ai.harness.enabled=false\n"
        "org.atmosphere.ai.harness.exclude-paths=/atmosphere/a, /atmosphere/b\n"
        "org.atmosphere.ai.compaction=summarizing\n"
        "org.atmosphere.ai.compaction.recent-window=4\n"
        "org.atmosphere.ai.prompt-cache.default=aggressive\n"
        "org.atmosphere.ai.toolOutputOffloadThreshold=2000\n"
        "org.atmosphere.ai.toolExecutionTimeout=30\n"
        "org.atmosphere.ai.filesystem.routes=memory/=/var/agent-memory,shared/=/var/shared\n"
        "atmosphere.ai.planning=builtin\n"
        "atmosphere.ai.filesystem=native\n"
        "atmosphere.ai.prompt-cache-key=false\n"
        f"atmosphere.workspace.root={tmp_path / 'ws'}\n",
    )
    settings = HarnessSettings()
    assert settings.kill_switch
    assert settings.exclude_paths == {"/atmosphere/a", "/atmosphere/b"}
    assert settings.compaction is Compaction.SUMMARIZING
    assert settings.compaction_recent_window == 4
    assert settings.prompt_cache_default is PromptCache.AGGRESSIVE
    assert settings.tool_output_offload_threshold == 2000
    assert settings.tool_execution_timeout == 30.0
    assert settings.filesystem_routes == (
        ("memory/", "/var/agent-memory"),
        ("shared/", "/var/shared"),
    )
    assert settings.planning is SurfaceMode.BUILTIN
    assert settings.filesystem is SurfaceMode.NATIVE
    assert settings.prompt_cache_key is PromptCacheKeyMode.DISABLED
    assert settings.workspace_root == tmp_path / "ws"


@pytest.mark.parametrize("suffix", [".yml", ".yaml"])
def test_yaml_nested_dotted_and_mixed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, suffix: str
) -> None:
    config(
        tmp_path,
        monkeypatch,
        "app" + suffix,
        """\
server:
  port: 8080            # someone else's key: left alone
org.atmosphere.ai.toolOutputOffloadThreshold: 0
atmosphere:
  ai.planning: native
  ai:
    filesystem:
      routes:           # a mapping is a route list too
        memory/: /var/a
  durable-runs:
    enabled: false
quarkus:
  atmosphere:
    ai:
      harness:
        excludePaths: [/x, /y]
llm_model: gpt-test     # a HarnessSettings field by name
ATMOSPHERE_AI_MAX_TOOL_ROUNDS: 7
filesystem_limits:
  max_files: 9
""",
    )
    settings = HarnessSettings()
    assert settings.tool_output_offload_threshold == 0
    assert settings.planning is SurfaceMode.NATIVE
    assert settings.filesystem_routes == (("memory/", "/var/a"),)
    assert settings.durable_runs is False
    assert settings.exclude_paths == {"/x", "/y"}
    assert settings.llm_model == "gpt-test"
    assert settings.max_tool_rounds == 7
    assert settings.filesystem_limits.max_files == 9


def test_toml_tables_and_dotted_keys(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config(
        tmp_path,
        monkeypatch,
        "atmosphere.toml",
        """\
llm_runtime = "scripted"

[atmosphere.ai.harness]
enabled = true
exclude-paths = ["/atmosphere/internal-webhook"]
prompt-cache-default = "aggressive"

[org.atmosphere.ai]
toolExecutionTimeout = 45
"compaction.recent-window" = 3
""",
    )
    settings = HarnessSettings()
    assert settings.enabled is True
    assert settings.exclude_paths == {"/atmosphere/internal-webhook"}
    assert settings.prompt_cache_default is PromptCache.AGGRESSIVE
    assert settings.tool_execution_timeout == 45.0
    assert settings.compaction_recent_window == 3
    assert settings.llm_runtime.value == "scripted"


def test_properties_syntax() -> None:
    text = (
        "# comment\n"
        "  ! another\n"
        "a.plain=one\n"
        "a.colon : two\n"
        "a.space three\n"
        "a.continued=fir\\\n"
        "     st,second\n"
        "a.escaped=tab\\there caf\\u00e9 \\= \\\\\n"
        "a\\=key=x\n"
        "a.empty=\n"
        "a.plain=last wins\n"
    )
    assert parse_properties(text.encode()) == {
        "a.plain": "last wins",
        "a.colon": "two",
        "a.space": "three",
        "a.continued": "first,second",
        "a.escaped": "tab\there café = \\",
        "a=key": "x",
        "a.empty": "",
    }
    assert parse_properties("k=caf\xe9".encode("latin-1")) == {"k": "café"}


def test_spring_list_indices_in_properties(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config(
        tmp_path,
        monkeypatch,
        "application.properties",
        "atmosphere.ai.harness.exclude-paths[1]=/second\n"
        "atmosphere.ai.harness.exclude-paths[0]=/first\n",
    )
    assert HarnessSettings().exclude_paths == {"/first", "/second"}


# --- every seed key, every spelling ----------------------------------------------------------

VALUES: dict[str, tuple[str, Any]] = {
    "enabled": ("true", True),
    "exclude_paths": ("/a,/b", frozenset({"/a", "/b"})),
    "compaction": ("token-window", Compaction.TOKEN_WINDOW),
    "compaction_recent_window": ("11", 11),
    "prompt_cache_default": ("none", PromptCache.NONE),
    "planning": ("native", SurfaceMode.NATIVE),
    "filesystem": ("builtin", SurfaceMode.BUILTIN),
    "filesystem_routes": ("m/=/var/m", (("m/", "/var/m"),)),
    "tool_output_offload_threshold": ("77", 77),
    "tool_execution_timeout": ("12.5", 12.5),
    "prompt_cache_key": ("true", PromptCacheKeyMode.ENABLED),
    "workspace_root": ("/srv/agents", Path("/srv/agents")),
    "durable_runs": ("true", True),
    "admin_http_read_auth_required": ("true", True),
}


def _camel(key: str) -> str:
    return re.sub(r"-([a-z])", lambda m: m[1].upper(), key)


def _kebab(key: str) -> str:
    return re.sub(r"([a-z])([A-Z])", lambda m: f"{m[1]}-{m[2].lower()}", key)


SPELLINGS = [
    (seed.field, spelling, variant)
    for seed in SEED_KEYS
    for spelling in (seed.spring, seed.quarkus, seed.servlet)
    if spelling is not None
    for variant in sorted({spelling, _camel(spelling), _kebab(spelling)})
]


def test_every_seed_key_has_a_test_value() -> None:
    assert {seed.field for seed in SEED_KEYS} == set(VALUES)


@pytest.mark.parametrize(("field", "spelling", "variant"), SPELLINGS)
def test_every_seed_spelling_sets_its_field(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    field: str,
    spelling: str,
    variant: str,
) -> None:
    raw, parsed = VALUES[field]
    config(tmp_path, monkeypatch, "seed.properties", f"{variant}={raw}\n")
    with caplog.at_level(logging.WARNING, logger="atmosphere_harness"):
        assert getattr(HarnessSettings(), field) == parsed
    assert not warnings(caplog)


@pytest.mark.parametrize("prefix", ["", "quarkus.", "org."])
def test_the_three_prefixes_are_interchangeable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, prefix: str
) -> None:
    config(
        tmp_path,
        monkeypatch,
        "any.properties",
        f"{prefix}atmosphere.ai.harness.compaction=summarizing\n"
        f"{prefix}atmosphere.ai.toolOutputOffloadThreshold=5\n",
    )
    settings = HarnessSettings()
    assert (settings.compaction, settings.tool_output_offload_threshold) == (
        Compaction.SUMMARIZING,
        5,
    )


def test_quarkus_durable_runs_opt_out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = config(
        tmp_path,
        monkeypatch,
        "a.properties",
        f"quarkus.atmosphere.ai.harness.enabled=true\n{QUARKUS_DURABLE_OPT_OUT}=false\n",
    )
    assert HarnessSettings().durable_runs_effective is False
    path.write_text(f"quarkus.atmosphere.ai.harness.enabled=true\n{QUARKUS_DURABLE_OPT_OUT}=true\n")
    assert HarnessSettings().durable_runs_effective is True, "true is the default: implied"
    path.write_text(
        f"{QUARKUS_DURABLE_OPT_OUT}=false\nquarkus.atmosphere.durable-runs.enabled=true\n"
    )
    assert HarnessSettings().durable_runs_effective is True, "an explicit enabled=true wins"


# --- precedence: constructor > environment > file > defaults ---------------------------------


def test_constructor_beats_environment_beats_file_beats_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config(
        tmp_path,
        monkeypatch,
        "application.yml",
        """\
atmosphere:
  ai:
    harness:
      compaction: summarizing
      prompt-cache-default: aggressive
      enabled: true
    planning: builtin
org.atmosphere.ai.toolExecutionTimeout: 30
""",
    )
    from_file = HarnessSettings()
    assert from_file.compaction is Compaction.SUMMARIZING
    assert from_file.tool_execution_timeout == 30.0
    assert from_file.max_tool_rounds == 50, "unset everywhere: the default"

    monkeypatch.setenv("ATMOSPHERE_AI_HARNESS_COMPACTION", "token-window")
    monkeypatch.setenv("LLM_PLANNING", "native")  # the fallback name beats the file too
    monkeypatch.setenv("ATMOSPHERE_AI_HARNESS_ENABLED", "false")
    from_env = HarnessSettings()
    assert from_env.compaction is Compaction.TOKEN_WINDOW
    assert from_env.planning is SurfaceMode.NATIVE
    assert from_env.enabled is False
    assert from_env.prompt_cache_default is PromptCache.AGGRESSIVE, "the file still fills gaps"

    given = HarnessSettings(
        compaction=Compaction.SLIDING_WINDOW, planning=SurfaceMode.AUTO, tool_execution_timeout=9
    )
    assert given.compaction is Compaction.SLIDING_WINDOW
    assert given.planning is SurfaceMode.AUTO
    assert given.tool_execution_timeout == 9.0


def test_the_constructor_can_name_the_file(tmp_path: Path) -> None:
    path = tmp_path / "application.yml"
    path.write_text(SPRING_YAML)
    settings = HarnessSettings(config_file=path)
    assert settings.enabled is True
    assert settings.config_file == path
    assert HarnessSettings().enabled is None, "no file without the setting"


def test_a_file_cannot_name_another_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config(tmp_path, monkeypatch, "a.properties", "config_file=/nowhere.yml\nllm_model=m\n")
    settings = HarnessSettings()
    assert settings.llm_model == "m"
    assert settings.config_file == tmp_path / "a.properties"


# --- unknown keys: one WARN each ---------------------------------------------------------------


def test_unknown_atmosphere_keys_warn_once_each(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    path = config(
        tmp_path,
        monkeypatch,
        "application.properties",
        "atmosphere.ai.harness.enabeld=true\n"
        "quarkus.atmosphere.ai.mystery=1\n"
        "org.atmosphere.nothing.here=2\n"
        "atmosphere.ai.harness.compaction=summarizing\n"
        "server.port=8080\n"
        "spring.application.name=demo\n"
        "quarkus.http.port=9000\n"
        "org.other.key=3\n",
    )
    with caplog.at_level(logging.WARNING, logger="atmosphere_harness"):
        HarnessSettings()
        HarnessSettings()  # read again: no second warning
    unknown = [r.getMessage() for r in caplog.records if "unknown configuration" in r.getMessage()]
    named = sorted(re.findall(r" key='([^']+)'", " ".join(unknown)))
    assert named == [
        "atmosphere.ai.harness.enabeld",
        "org.atmosphere.nothing.here",
        "quarkus.atmosphere.ai.mystery",
    ]
    assert all(str(path) in message for message in unknown), "each names the file"
    assert len(warnings(caplog)) == 3


def test_seed_keys_without_an_equivalent_say_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    config(
        tmp_path,
        monkeypatch,
        "application.yml",
        """\
atmosphere:
  admin:
    workspace-read-auth-required: false
  durable-runs:
    journal: memory
  tools:
    permissions:
      delete: deny
""",
    )
    with caplog.at_level(logging.WARNING, logger="atmosphere_harness"):
        HarnessSettings()
    messages = warnings(caplog)
    assert len(messages) == 3
    assert all("no equivalent in atmosphere-harness" in message for message in messages)
    assert any("always require the admin token" in message for message in messages)


def test_one_setting_twice_warns_and_the_later_key_wins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    config(
        tmp_path,
        monkeypatch,
        "application.properties",
        "atmosphere.ai.harness.compaction=summarizing\norg.atmosphere.ai.compaction=token-window\n",
    )
    with caplog.at_level(logging.WARNING, logger="atmosphere_harness"):
        assert HarnessSettings().compaction is Compaction.TOKEN_WINDOW
    (message,) = warnings(caplog)
    assert "twice" in message
    assert "atmosphere.ai.harness.compaction" in message


# --- a bad file stops start-up -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "content", "problem"),
    [
        ("missing.yml", None, "no such file"),
        ("application.json", "{}", "must end in .yml, .yaml, .properties or .toml"),
        ("broken.yml", "atmosphere:\n  ai: [unclosed\n", "cannot read it as YAML"),
        ("broken.yaml", "- a\n- b\n", "keys and values at its top level, got a list"),
        ("broken.toml", "[atmosphere\nenabled = true\n", "cannot read it as TOML"),
        ("binary.yml", b"\xff\xfe\x00garbage\x00", "cannot read it as YAML"),
        ("deep.yml", "a:\n" + "".join("  " * i + "b:\n" for i in range(1, 40)), "nested"),
        ("deeper.yaml", "[" * 100_000, "cannot read it as YAML"),
    ],
)
def test_a_missing_or_unparsable_file_fails_with_a_clear_message(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    name: str,
    content: str | bytes | None,
    problem: str,
) -> None:
    path = tmp_path / name
    if content is not None:
        config(tmp_path, monkeypatch, name, content)
    else:
        monkeypatch.setenv("ATMOSPHERE_CONFIG_FILE", str(path))
    with pytest.raises(ConfigFileError) as raised:
        HarnessSettings()
    message = str(raised.value)
    assert message.startswith(f"ATMOSPHERE_CONFIG_FILE={path}: ")
    assert problem in message


def test_a_directory_is_not_a_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "conf.yml").mkdir()
    monkeypatch.setenv("ATMOSPHERE_CONFIG_FILE", str(tmp_path / "conf.yml"))
    with pytest.raises(ConfigFileError, match="no such file"):
        HarnessSettings()


def test_a_blank_setting_reads_no_file(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ATMOSPHERE_CONFIG_FILE", "")
    assert HarnessSettings().config_file is None


# --- the docs -----------------------------------------------------------------------------------


def test_the_configuration_page_documents_every_seed_key() -> None:
    page = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    section = page[page.index("## Configuration file") :]
    for seed in SEED_KEYS:
        row = next(line for line in section.splitlines() if f"| `{seed.field}` |" in line)
        for spelling in (seed.spring, seed.quarkus, seed.servlet):
            if spelling is not None:
                assert f"`{spelling}`" in row, (seed.field, spelling)
    for key, _why in UNSUPPORTED:
        assert f"`{key}`" in section, key
    assert f"`{QUARKUS_DURABLE_OPT_OUT}`" in section
