"""`SKILL.md` parsing and discovery: front matter through PyYAML, bounds, WARNs, override order."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from atmosphere_harness._errors import SkillSourceError
from atmosphere_harness._skills.catalog import (
    MAX_SKILL_FILE_BYTES,
    discover,
    parse_skill,
    sources_for,
)
from tests.skills.support import write_skill


def test_front_matter_is_read_with_optional_keys(tmp_path: Path) -> None:
    folder = tmp_path / "pdf"
    folder.mkdir()
    (folder / "SKILL.md").write_text(
        "---\n"
        "name: pdf\n"
        "description: >\n  Fill PDF forms\n  and extract text.\n"
        "allowed-tools: read_file grep\n"
        "metadata:\n  version: '2'\n"
        "---\n# PDF\n",
        encoding="utf-8",
    )
    skill = parse_skill(folder, "convention")
    assert skill is not None
    assert skill.name == "pdf"
    assert skill.description == "Fill PDF forms and extract text."
    assert skill.allowed_tools == ("read_file", "grep")
    assert dict(skill.metadata) == {"version": "2"}
    assert skill.path == "skills/pdf/SKILL.md"


@pytest.mark.parametrize(
    ("content", "why"),
    [
        ("# no front matter\n", "has no YAML front matter"),
        ("---\nname: [unclosed\ndescription: x\n---\n", "is not valid YAML"),
        ("---\n- a\n- b\n---\n", "is not a mapping"),
        ("---\ndescription: no name\n---\n", "has no 'name'"),
        ("---\nname: nodesc\n---\n", "has no 'description'"),
        (f"---\nname: {'n' * 65}\ndescription: d\n---\n", "its name is 65 characters (limit 64)"),
        (
            f"---\nname: long\ndescription: {'d' * 1025}\n---\n",
            "its description is 1025 characters (limit 1024)",
        ),
        ("---\nname: ../up\ndescription: d\n---\n", "is not letters, digits"),
    ],
)
def test_a_malformed_skill_is_skipped_with_a_warn_naming_its_file(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, content: str, why: str
) -> None:
    folder = tmp_path / "bad"
    folder.mkdir()
    (folder / "SKILL.md").write_text(content, encoding="utf-8")
    with caplog.at_level(logging.WARNING, logger="atmosphere_harness"):
        assert parse_skill(folder, "convention") is None
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(str(folder / "SKILL.md") in line and why in line for line in warned), warned


def test_limits_at_the_edge_are_accepted(tmp_path: Path) -> None:
    write_skill(tmp_path, "n" * 64, "d" * 1024)
    skill = parse_skill(tmp_path / ("n" * 64), "convention")
    assert skill is not None
    assert len(skill.description) == 1024


def test_an_oversized_or_binary_skill_file_is_skipped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    big = write_skill(tmp_path, "big", "d", "x" * MAX_SKILL_FILE_BYTES)
    binary = tmp_path / "binary"
    binary.mkdir()
    (binary / "SKILL.md").write_bytes(b"---\nname: binary\ndescription: \xff\xfe\n---\n")
    with caplog.at_level(logging.WARNING, logger="atmosphere_harness"):
        assert parse_skill(big, "convention") is None
        assert parse_skill(binary, "convention") is None
    text = caplog.text
    assert f"limit {MAX_SKILL_FILE_BYTES}" in text
    assert "is not UTF-8 text" in text


def test_later_sources_override_earlier_ones_by_name(tmp_path: Path) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    write_skill(first, "alpha", "first alpha")
    write_skill(first, "beta", "first beta")
    write_skill(second, "beta", "second beta", folder="renamed-folder")
    write_skill(tmp_path / "not-a-skill" / "deeper", "hidden", "never found")
    (first / "empty").mkdir()
    found = discover([("convention", first), ("settings", second)])
    assert {name: s.description for name, s in found.items()} == {
        "alpha": "first alpha",
        "beta": "second beta",
    }
    assert found["beta"].source == "settings"
    assert found["beta"].folder == second / "renamed-folder"


def test_a_source_may_be_one_skill_folder(tmp_path: Path) -> None:
    single = write_skill(tmp_path, "solo", "one skill")
    assert list(discover([("decorator", single)])) == ["solo"]


def test_a_declared_folder_that_does_not_exist_is_a_start_up_error(tmp_path: Path) -> None:
    with pytest.raises(SkillSourceError, match="skills= names a skill folder that does not exist"):
        sources_for(None, [str(tmp_path / "missing")], [])
    with pytest.raises(SkillSourceError, match=r"^ATMOSPHERE_AI_SKILLS_DIRS names"):
        sources_for(None, [], [tmp_path / "absent"])
