"""Fact extraction at conversation close: the prompt, a lenient parser, a screen, reconciliation.

The model is asked for a JSON array of short facts (Atmosphere's prompt, word for word). Its
answer is parsed leniently (code fences, prose around the array, a truncated tail) but, unlike
Atmosphere, string escapes are decoded. Facts that read like instructions to a model are
dropped before anything is stored: a fact is replayed into every later prompt of that user, so a
stored injection would outlive the conversation that planted it. What remains is reconciled
against the user's existing facts so a fact learned twice is stored once.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence

from .._contracts import UserDailyCap
from .._log import get_logger
from .._runtimes.base import AgentRuntime, Message
from .compaction import transcript
from .long_term import MAX_FACT_CHARS
from .oneshot import ask

log = get_logger(__name__)

EXTRACTION_SYSTEM_PROMPT = "You are a fact extraction assistant. Respond with JSON only."
EXTRACTION_PROMPT = (
    "Extract key facts about the user from this conversation.\n"
    "Return ONLY a JSON array of short factual statements. Example:\n"
    '["User\'s name is Alice", "Lives in Montreal", "Has a golden retriever named Max"]\n'
    "If no notable facts, return [].\n"
    "Do not include opinions, questions, or conversational filler.\n"
    "\n"
    "Conversation:\n"
    "{conversation}"
)
MAX_EXTRACTED_FACTS = 50
MAX_TRANSCRIPT_CHARS = 16_000
"""The newest part of the conversation the extraction prompt carries."""

_FENCE = re.compile(r"^```[A-Za-z0-9_-]*\s*|\s*```\s*$")
_JSON_STRING = re.compile(r'"(?:[^"\\\x00-\x1f]|\\(?:["\\/bfnrt]|u[0-9A-Fa-f]{4}))*"')


def parse_fact_array(text: str) -> list[str]:
    """The strings of the JSON array in a model's answer; `[]` when there is none.

    Fences and prose around the array are ignored. A valid array keeps its string elements. A
    broken one (cut off, a stray token) keeps the well-formed strings before the first element
    that is not one. Escapes (`\\"`, `\\n`, `\\u00e9`) are decoded in both cases.
    """
    body = _FENCE.sub("", text.strip())
    start = body.find("[")
    if start < 0:
        return []
    end = body.rfind("]")
    candidate = body[start : end + 1] if end > start else body[start:]
    try:
        value = json.loads(candidate)
    except ValueError:
        return _lenient_strings(candidate[1:])
    if not isinstance(value, list):
        return []
    return [item for item in value if isinstance(item, str)]


def _lenient_strings(text: str) -> list[str]:
    """Successive JSON strings (commas and whitespace between), decoded; stops at anything else."""
    found: list[str] = []
    position = 0
    while True:
        while position < len(text) and text[position] in " ,\t\r\n":
            position += 1
        match = _JSON_STRING.match(text, position)
        if match is None:
            return found
        found.append(json.loads(match.group(0)))
        position = match.end()


# --- the screen ----------------------------------------------------------------------------

_INJECTION_PATTERNS = [
    r"\b(ignore|disregard|forget|override|bypass)\b.{0,40}\b(instructions?|prompts?|rules|"
    r"guidelines|directions|polic(y|ies)|everything)\b",
    r"\b(system|developer)\s+(prompt|message|instructions?)\b",
    r"\byou\s+(are|will)\s+now\b",
    r"\bfrom\s+now\s+on\b",
    r"\b(always|never)\s+(respond|reply|answer|say|tell|call|use|run|reveal)\b",
    r"\b(act|behave|pretend|roleplay)\s+as\b",
    r"\bnew\s+(instructions?|rules|persona)\b",
    r"\b(jailbreak|do anything now|dan mode|developer mode)\b",
    r"\b(reveal|print|show|leak|exfiltrate|send)\b.{0,40}\b(secrets?|api[\s_-]?keys?|"
    r"passwords?|tokens?|credentials|system prompt)\b",
    r"(<\|[a-z_]+\|>|\[/?inst\]|<<\s*sys\s*>>|</?(system|assistant|tool)>)",
    r"^\s*(system|assistant|developer|tool)\s*:",
    r"```",
]
_INJECTION = re.compile("|".join(f"(?:{pattern})" for pattern in _INJECTION_PATTERNS), re.I)


def looks_like_injection(fact: str) -> bool:
    """True when a fact reads like an instruction to a model rather than a fact about a user."""
    return _INJECTION.search(fact) is not None


def screen_facts(facts: Iterable[str]) -> list[str]:
    """Keep clean, bounded facts; drop (and log) the ones that look like prompt injection."""
    kept: list[str] = []
    for fact in facts:
        text = " ".join(fact.split())
        if not text or len(text) > MAX_FACT_CHARS:
            continue
        if looks_like_injection(text):
            log.warning("dropped an extracted fact that looks like prompt injection", fact=text)
            continue
        kept.append(text)
    return kept


# --- reconciliation ------------------------------------------------------------------------


def fact_key(fact: str) -> str:
    """Case, spacing and punctuation do not make a fact new."""
    return " ".join(re.sub(r"[^\w\s]", " ", fact.casefold()).split())


def reconcile(existing: Iterable[str], candidates: Iterable[str]) -> list[str]:
    """The candidates not already known (nor repeated among themselves), in order."""
    seen = {fact_key(fact) for fact in existing}
    fresh: list[str] = []
    for fact in candidates:
        key = fact_key(fact)
        if key and key not in seen:
            seen.add(key)
            fresh.append(fact)
    return fresh


# --- the model call ------------------------------------------------------------------------


def conversation_text(messages: Sequence[Message]) -> str:
    """User and assistant text as `role: content` lines, newest `MAX_TRANSCRIPT_CHARS` kept.

    Tool traffic is left out: it is bulky, rarely about the user, and the likeliest carrier of
    injected text.
    """
    spoken = [
        Message(message.role, message.content)
        for message in messages
        if message.role in ("user", "assistant") and message.content.strip()
    ]
    text = transcript(spoken)
    return text[-MAX_TRANSCRIPT_CHARS:]


async def extract_facts(
    runtime: AgentRuntime,
    messages: Sequence[Message],
    *,
    timeout: float,
    conversation_id: str,
    user_id: str | None = None,
    cap: UserDailyCap | None = None,
) -> list[str]:
    """Ask `runtime` for the facts in `messages`; `[]` on any failure (extraction fails open).

    With `cap` the call counts toward `user_id`'s daily tokens, and a user at the cap raises
    `UsageLimitExceeded` before the call (the conversation stays to be extracted later)."""
    text = conversation_text(messages)
    if not text:
        return []
    answer = await ask(
        runtime,
        system_prompt=EXTRACTION_SYSTEM_PROMPT,
        prompt=EXTRACTION_PROMPT.format(conversation=text),
        purpose="memory-extraction",
        conversation_id=f"memory-extraction:{conversation_id}",
        timeout=timeout,
        user_id=user_id,
        cap=cap,
    )
    if answer is None:
        return []
    return screen_facts(parse_fact_array(answer))[:MAX_EXTRACTED_FACTS]
