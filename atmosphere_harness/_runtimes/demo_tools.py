"""How the offline demo model picks one of the host's own tools and fills its arguments.

Deliberately simple and predictable, so a newcomer's first tool runs with no API key:

- **Which tool.** Only the host's tools are candidates (never a built-in harness tool such as
  `write_file`, see `BUILTIN_TOOL_NAMES`). A tool is asked for when the message names it: its
  name (`get_weather`, or spelled `get weather`), a word of its name of four letters or more
  (`weather`), or a word of five letters or more from the first line of its description that no
  other offered tool shares (`Find a customer order` -> `customer`, `order`). The tool with the
  most such words in the message wins; on a tie, the one offered first.
- **Its arguments.** Only required parameters are filled. A parameter the message names
  (`city: Paris`, `city=Paris`, `city is "Paris"`) gets that value. The first other required
  string gets, in this order: the first quoted text; a run of capitalised words that does not
  start a sentence (`Paris`, `New York`); the phrase after the last `in`, `for`, `of`, `at`,
  `about`, `on`, `to`, `from`, `near`, `named` or `called` (without a leading article); else the
  whole message. Further required strings get the whole message; a string `enum` gets the first
  of its values the message contains (else its first value); integers and numbers get the
  numbers of the message in order; booleans get `false`. A parameter that cannot be filled is
  left out, and the tool's own `invalid_arguments` answer is what the demo reports.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from .base import ToolSpec

BUILTIN_TOOL_NAMES = frozenset(
    {
        "write_todos",
        "ls",
        "read_file",
        "write_file",
        "edit_file",
        "glob",
        "grep",
        "delete",
        "rename",
        "task",
        "delegate_task",
    }
)
"""The harness's own tools (fixed names); the demo model never treats them as the host's."""

_STOP_WORDS = frozenset(  # description words too common to name a tool (five letters or more)
    """about above after again against among another because before being below between calls
    could current doing during every first further given having itself never number optional
    other return returns should since string their there these those through tools under
    until using value values where which while whose within without would""".split()  # noqa: SIM905
)
_WORD = re.compile(r"[A-Za-z][A-Za-z0-9]*")
_PREPOSITION = re.compile(
    r"\b(?:in|for|of|at|about|on|to|from|near|named|called)\s+(?P<phrase>[^?.!,;:\n]+)",
    re.IGNORECASE,
)
_ARTICLE = re.compile(r"^(?:the|a|an|my|our|your)\s+", re.IGNORECASE)
_TRAILING = re.compile(r"\s+(?:today|tonight|tomorrow|now|right now|please)$", re.IGNORECASE)
_QUOTED = re.compile(r"\"([^\"\n]+)\"|“([^”\n]+)”|(?<![A-Za-z])'([^'\n]+)'(?![A-Za-z])")
_CAPITALISED_RUN = re.compile(r"[A-Z][\w'-]*(?:\s+[A-Z][\w'-]*)*")
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def _name_words(name: str) -> list[str]:
    """`get_weather` / `getWeather` / `get-weather` -> `["get", "weather"]`."""
    spaced = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", " ", name)
    return [word.lower() for word in re.split(r"[\s_-]+", spaced) if word]


def _keywords(spec: ToolSpec) -> set[str]:
    words = {word for word in _name_words(spec.name) if len(word) >= 4}
    first_line = spec.description.strip().splitlines()[0] if spec.description.strip() else ""
    words |= {
        word.lower()
        for word in _WORD.findall(first_line)
        if len(word) >= 5 and word.lower() not in _STOP_WORDS
    }
    return words


def _mentions(text: str, phrase: str) -> bool:
    pattern = r"[\s_-]+".join(re.escape(part) for part in phrase.split())
    return re.search(rf"(?<![A-Za-z0-9]){pattern}(?![A-Za-z0-9])", text, re.IGNORECASE) is not None


def pick_user_tool(message: str, tools: Sequence[ToolSpec]) -> ToolSpec | None:
    """The host tool the message asks for, or `None` (see the module docstring)."""
    candidates = [spec for spec in tools if spec.name not in BUILTIN_TOOL_NAMES]
    keywords = {spec.name: _keywords(spec) for spec in candidates}
    best: tuple[int, ToolSpec] | None = None
    for spec in candidates:
        others = set().union(*(keywords[o.name] for o in candidates if o.name != spec.name))
        distinctive = keywords[spec.name] - others
        score = sum(1 for word in distinctive if _mentions(message, word))
        if _mentions(message, " ".join(_name_words(spec.name))) or _mentions(message, spec.name):
            score += 1
        if score and (best is None or score > best[0]):
            best = (score, spec)
    return best[1] if best else None


def fill_arguments(message: str, spec: ToolSpec) -> dict[str, Any]:
    """Arguments for `spec`'s required parameters, taken from the message."""
    schema = spec.parameters
    properties: Mapping[str, Any] = schema.get("properties") or {}
    required = [name for name in schema.get("required") or [] if name in properties]
    arguments: dict[str, Any] = {}
    numbers = [float(n) for n in _NUMBER.findall(message)]
    first_string = True
    for name in required:
        prop = properties[name]
        kind = _json_type(prop)
        named = _named_value(message, name)
        if prop.get("enum"):
            values = [str(v) for v in prop["enum"]]
            arguments[name] = next((v for v in values if _mentions(message, v)), prop["enum"][0])
        elif kind == "string":
            if named is not None:
                arguments[name] = named
            elif first_string:
                arguments[name] = _subject(message, spec)
                first_string = False
            else:
                arguments[name] = message.strip()
        elif kind in ("integer", "number"):
            value = _as_number(named) if named is not None else None
            if value is None and numbers:
                value = numbers.pop(0)
            if value is not None:
                arguments[name] = int(value) if kind == "integer" else value
        elif kind == "boolean":
            arguments[name] = (named or "").lower() in ("true", "yes", "on", "1")
    return arguments


def _json_type(prop: Mapping[str, Any]) -> str | None:
    kind = prop.get("type")
    if isinstance(kind, str):
        return kind
    for option in prop.get("anyOf") or ():
        if isinstance(option, Mapping) and option.get("type") not in (None, "null"):
            return str(option["type"])
    return None


def _as_number(text: str) -> float | None:
    match = _NUMBER.search(text)
    return float(match.group(0)) if match else None


def _named_value(message: str, name: str) -> str | None:
    spelled = r"[\s_-]+".join(re.escape(part) for part in _name_words(name))
    match = re.search(
        rf"(?<![A-Za-z0-9])(?:{spelled})\s*(?:=|:|\bis\b)\s*"
        r"(?:\"([^\"\n]*)\"|'([^'\n]*)'|([^,;?!\n]+?))\s*(?=$|[,;?!\n]|\s+and\s)",
        message,
        re.IGNORECASE,
    )
    if match is None:
        return None
    return next(group for group in match.groups() if group is not None).strip()


def _subject(message: str, spec: ToolSpec) -> str:
    """What the message is about: quoted text, a proper noun, a prepositional phrase, or all."""
    quoted = _QUOTED.search(message)
    if quoted:
        return next(group for group in quoted.groups() if group is not None).strip()
    tool_words = set(_name_words(spec.name)) | _keywords(spec)
    for match in _CAPITALISED_RUN.finditer(message):
        before = message[: match.start()].rstrip()
        if not before or before[-1] in ".?!:;\n":
            continue  # a capital that only starts a sentence
        words = [w for w in match.group(0).split() if w.lower() not in tool_words and w != "I"]
        if words:
            return " ".join(words)
    phrases = [m.group("phrase") for m in _PREPOSITION.finditer(message)]
    if phrases:
        phrase = _TRAILING.sub("", _ARTICLE.sub("", phrases[-1].strip())).strip()
        if phrase:
            return phrase
    return message.strip()
