"""The policy chain (PolicyAdmissionGateTest), entry-point discovery and ToolApprovalPolicyTest."""

from __future__ import annotations

import asyncio
import textwrap
from pathlib import Path
from typing import Any

import pytest

from atmosphere_harness import (
    Admit,
    Deny,
    PolicyContext,
    PolicyRequest,
    Prefer,
    ToolApprovalPolicy,
    ToolKind,
    Transform,
)
from atmosphere_harness._governance import PolicyChain, PolicyPhase, load_policies
from atmosphere_harness._governance import chain as chain_module
from atmosphere_harness._governance.approvals import Answer, AnswerStatus, ApprovalRegistry
from atmosphere_harness._tools.base import Tool


class Rule:
    """A policy whose decision is a function of the context; it records what it saw."""

    def __init__(self, name: str, decide: Any = None) -> None:
        self.name = name
        self.decide = decide or (lambda ctx: Admit())
        self.seen: list[PolicyContext] = []

    def evaluate(self, ctx: PolicyContext) -> Any:
        self.seen.append(ctx)
        return self.decide(ctx)


def pre(message: str = "hello", **metadata: Any) -> PolicyContext:
    return PolicyContext(PolicyPhase.PRE_ADMISSION, PolicyRequest(message, metadata))


async def test_an_empty_chain_admits_the_request_unchanged() -> None:
    ctx = pre()
    verdict = await PolicyChain().admit(ctx)
    assert verdict.admitted
    assert verdict.request is ctx.request


async def test_transforms_chain_and_later_policies_see_the_rewrite() -> None:
    upper = Rule(
        "upper", lambda ctx: Transform(ctx.request.with_message(ctx.request.message.upper()))
    )
    suffix = Rule(
        "suffix", lambda ctx: Transform(ctx.request.with_message(ctx.request.message + "!"))
    )
    watcher = Rule("watcher")
    verdict = await PolicyChain([upper, suffix, watcher]).admit(pre("hi"))
    assert verdict.admitted
    assert verdict.request.message == "HI!"
    assert watcher.seen[0].request.message == "HI!"


async def test_a_deny_halts_the_chain_and_names_the_policy() -> None:
    later = Rule("later")
    chain = PolicyChain([Rule("first"), Rule("guard", lambda ctx: Deny("no way")), later])
    verdict = await chain.admit(pre())
    assert not verdict.admitted
    assert (verdict.denied_by, verdict.reason, verdict.failure) == ("guard", "no way", None)
    assert later.seen == []


@pytest.mark.parametrize(
    "decide",
    [
        pytest.param(lambda ctx: 1 / 0, id="raises"),
        pytest.param(lambda ctx: None, id="returns-none"),
        pytest.param(lambda ctx: True, id="returns-a-bool"),
        pytest.param(lambda ctx: Transform("not a request"), id="bad-transform"),
    ],
)
async def test_a_broken_policy_denies_fail_closed(decide: Any) -> None:
    verdict = await PolicyChain([Rule("broken", decide)]).admit(pre())
    assert not verdict.admitted
    assert verdict.denied_by == "broken"
    assert verdict.failure


async def test_async_policies_are_awaited_and_a_slow_one_fails_closed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    class Slow:
        name = "slow"

        def __init__(self, delay: float) -> None:
            self.delay = delay

        async def evaluate(self, ctx: PolicyContext) -> Any:
            await asyncio.sleep(self.delay)
            return Deny("slowly denied")

    assert (await PolicyChain([Slow(0)]).admit(pre())).reason == "slowly denied"
    monkeypatch.setattr(chain_module, "POLICY_TIMEOUT", 0.05)
    verdict = await PolicyChain([Slow(5)]).admit(pre())
    assert verdict.denied_by == "slow"
    assert verdict.failure is not None


async def test_prefer_is_advisory() -> None:
    verdict = await PolicyChain([Rule("hint", lambda ctx: Prefer("cheap-model", "cost"))]).admit(
        pre()
    )
    assert verdict.admitted


async def test_post_response_runs_every_policy_whatever_the_others_say() -> None:
    slots = {"taken": 0}

    def acquire_or_release(ctx: PolicyContext) -> Any:
        if ctx.phase is PolicyPhase.PRE_ADMISSION:
            slots["taken"] += 1
        else:
            slots["taken"] -= 1
        return Admit()

    denier = Rule("denier", lambda ctx: Deny("flagged"))
    raiser = Rule("raiser", lambda ctx: 1 / 0)
    limiter = Rule("limiter", acquire_or_release)
    chain = PolicyChain([denier, raiser, limiter])
    await chain.admit(pre())  # denied by the first: the limiter never took a slot
    slots["taken"] = 1
    done = PolicyContext(PolicyPhase.POST_RESPONSE, PolicyRequest("x"), accumulated_response="ok")
    await chain.release(done)
    assert slots["taken"] == 0, "the last policy still released its slot"
    assert limiter.seen[-1].accumulated_response == "ok"


def test_decisions_and_installation_are_checked() -> None:
    with pytest.raises(ValueError, match="non-blank reason"):
        Deny("  ")
    chain = PolicyChain([Rule("a"), Rule("b")])
    assert chain.install(Rule("a")) is False, "the first policy of a name wins"
    assert [p.name for p in chain.policies] == ["a", "b"]
    with pytest.raises(TypeError, match="not a governance policy"):
        chain.install(object())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"policies\[1\]"):
        load_policies([Rule("ok"), "not a policy"])


def _install_distribution(root: Path, module: str, body: str, entry: str) -> None:
    (root / f"{module}.py").write_text(textwrap.dedent(body), encoding="utf-8")
    info = root / f"{module}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[atmosphere_harness.policies]\n{entry}\n")


async def test_entry_point_policies_follow_the_explicit_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _install_distribution(
        tmp_path,
        "acme_policies",
        """
        from atmosphere_harness import Admit, Deny

        class NoSecrets:
            name = "no-secrets"

            def evaluate(self, ctx):
                return Deny("secret") if "secret" in ctx.request.message else Admit()

        def more():
            return [NoSecrets()]
        """,
        "acme = acme_policies:NoSecrets\nmore = acme_policies:more",
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    chain = load_policies([Rule("explicit")])
    assert [p.name for p in chain.policies] == ["explicit", "no-secrets"]
    verdict = await chain.admit(pre("the secret plan"))
    assert verdict.denied_by == "no-secrets"


def test_a_broken_entry_point_stops_the_app(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _install_distribution(tmp_path, "broken_policies", "x = 1\n", "bad = broken_policies:missing")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(RuntimeError, match=r"'bad'.*failed to load"):
        load_policies([])


# --- ToolApprovalPolicyTest ------------------------------------------------------------------


def _tool(name: str = "t", *, kind: ToolKind = ToolKind.OTHER, gated: bool = False) -> Tool:
    async def handler(arguments: Any, context: Any) -> str:
        return "ok"

    return Tool(name, name, {"type": "object"}, handler, kind=kind, requires_approval=gated)


def test_annotated_mirrors_the_flag_and_is_the_default_shape() -> None:
    policy = ToolApprovalPolicy.annotated()
    assert policy.requires_approval(_tool(gated=True))
    assert not policy.requires_approval(_tool(gated=False))
    assert not policy.denies_all


def test_allow_all_and_deny_all() -> None:
    assert not ToolApprovalPolicy.allow_all().requires_approval(_tool(gated=True))
    deny = ToolApprovalPolicy.deny_all()
    assert deny.requires_approval(_tool())
    assert deny.denies_all


def test_custom_delegates_to_its_predicate_and_fails_closed() -> None:
    deletes = ToolApprovalPolicy.custom(lambda tool: tool.kind is ToolKind.DELETE)
    assert deletes.requires_approval(_tool("delete", kind=ToolKind.DELETE))
    assert not deletes.requires_approval(_tool("ls", kind=ToolKind.READ))
    broken = ToolApprovalPolicy.custom(lambda tool: 1 / 0)
    assert broken.requires_approval(_tool()), "a failing predicate asks a person"
    with pytest.raises(ValueError, match="predicate must not be None"):
        ToolApprovalPolicy.custom(None)  # type: ignore[arg-type]


async def test_the_registry_answers_once_and_forgets_expired_ones() -> None:
    registry = ApprovalRegistry(max_pending=2)

    async def open_one() -> Any:
        return await registry.open(
            path="/p",
            conversation_id="c",
            user_id="ann",
            tool="t",
            tool_call_id="call",
            arguments={"a": 1},
            timeout=60,
        )

    first, second = await open_one(), await open_one()
    assert await open_one() is None, "bounded: a third waits nowhere"
    assert (
        await registry.answer("/other", first.id, Answer(True), user_id="ann")
        is AnswerStatus.UNKNOWN
    )
    assert (
        await registry.answer("/p", first.id, Answer(True), user_id="bob") is AnswerStatus.FORBIDDEN
    )
    assert (
        await registry.answer("/p", first.id, Answer(True), user_id="ann") is AnswerStatus.ACCEPTED
    )
    assert await registry.wait(first, 1) == Answer(True)
    assert (
        await registry.answer("/p", first.id, Answer(False), user_id="ann")
        is AnswerStatus.ALREADY_ANSWERED
    )
    assert [p.id for p in await registry.pending("/p", "c", user_id="ann")] == [second.id]
    assert await registry.wait(second, 0.01) is None, "no answer in time"
    assert (
        await registry.answer("/p", second.id, Answer(True), user_id="ann") is AnswerStatus.UNKNOWN
    )
    assert len(registry) == 0
    assert second.to_wire()["expiresAt"].endswith("Z")
