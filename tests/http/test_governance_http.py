"""Governance on every tool call over real HTTP (PolicyAdmissionGateToolCallTest), and approvals:
approve / deny / timeout round trips, 404 / 409 / 403, and a run that outlives its connection."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx2

from atmosphere_harness import (
    Admit,
    Deny,
    HarnessDep,
    ModelRequest,
    PolicyContext,
    ScriptedRuntime,
    ToolApprovalPolicy,
    ToolCall,
    ToolKind,
    Transform,
    agent,
    ai_endpoint,
    get_user_id,
    tool,
)
from atmosphere_harness._governance import policy_chain
from atmosphere_harness._web.deps import user_id_from_header
from tests.agents import echo
from tests.delegation_support import FrameReader, Recorder, deny_when, governed_app, open_prompt
from tests.support import of_type, serve
from tests.support import prompt as post_prompt

CALLS: list[str] = []


@tool(kind=ToolKind.DELETE)
async def purge(target: str) -> str:
    """Remove a target.

    Args:
        target: What to remove.
    """
    CALLS.append(f"purge {target}")
    return f"purged {target}"


@tool(requires_approval=True)
async def transfer(amount: int, to: str) -> str:
    """Send money (needs a person's approval).

    Args:
        amount: How much.
        to: Who gets it.
    """
    CALLS.append(f"transfer {amount} {to}")
    return f"sent {amount} to {to}"


Banker = echo(agent(name="banker", harness=()), "Banker", tools=[purge, transfer])


@tool(requires_approval=True)
async def shell(command: str) -> str:
    """Run a command line (needs a person's approval).

    Args:
        command: The command line.
    """
    CALLS.append(f"shell {command}")
    return f"ran {command}"


Operator = echo(agent(name="operator", harness=()), "Operator", tools=[shell])


BareChat = echo(ai_endpoint("/atmosphere/bare-chat"), "BareChat", tools=[purge])


PATH = "/atmosphere/agent/banker"
OPERATOR = "/atmosphere/agent/operator"


def call_then_report(*calls: ToolCall) -> ScriptedRuntime:
    """One model message with `calls`, then an answer quoting every tool result it got."""

    def report(request: ModelRequest) -> str:
        return " | ".join(m.content for m in request.messages if m.role == "tool")

    return ScriptedRuntime([list(calls), report])


# --- admission on every tool call -------------------------------------------------------------


async def test_no_policies_admit_every_call(workspace: Path) -> None:
    CALLS.clear()
    runtime = call_then_report(ToolCall("purge", {"target": "a"}))
    app = governed_app([Banker], runtime=runtime, workspace=workspace)
    async with serve(app) as base, httpx2.AsyncClient(base_url=base, timeout=30) as client:
        frames = await post_prompt(client, PATH, "go")
    assert CALLS == ["purge a"]
    assert frames[-1]["data"]["summary"] == "purged a"


async def test_a_deny_rule_on_the_tool_name_answers_the_call_and_the_client_sees_it(
    workspace: Path,
) -> None:
    CALLS.clear()
    guard = deny_when(
        "no-purge", lambda ctx: ctx.request.metadata.get("tool_name") == "purge", "purging is off"
    )
    runtime = call_then_report(ToolCall("purge", {"target": "a"}))
    app = governed_app([Banker], runtime=runtime, workspace=workspace, policies=[guard])
    async with serve(app) as base, httpx2.AsyncClient(base_url=base, timeout=30) as client:
        frames = await post_prompt(client, PATH, "go")
    assert CALLS == []
    [start] = of_type(frames, "tool-start")
    [result] = of_type(frames, "tool-result")
    assert start["seq"] < result["seq"]
    assert start["data"]["tool"] == result["data"]["tool"] == "purge"
    assert start["data"]["toolCallId"] == result["data"]["toolCallId"]
    assert start["data"]["arguments"] == {"target": "a"}
    assert result["data"]["result"] == frames[-1]["data"]["summary"], "exactly what the model got"
    answer = json.loads(frames[-1]["data"]["summary"])
    assert answer == {
        "status": "cancelled",
        "message": "Tool purge denied by policy 'no-purge': purging is off",
    }
    ctx = guard.seen[0]
    assert ctx.request.message == "call_tool:purge"
    assert ctx.request.metadata["action"] == "call_tool"
    assert ctx.request.metadata["tool_args"] == {"target": "a"}
    assert ctx.conversation_id == frames[0]["conversationId"]
    assert ctx.agent == "banker"


async def test_the_args_preview_is_cut_at_200_characters(workspace: Path) -> None:
    recorder = Recorder()
    long_target = "x" * 300
    runtime = call_then_report(ToolCall("purge", {"target": long_target}))
    app = governed_app([Banker], runtime=runtime, workspace=workspace, policies=[recorder])
    async with serve(app) as base, httpx2.AsyncClient(base_url=base, timeout=30) as client:
        await post_prompt(client, PATH, "go")
    preview = recorder.seen[0].request.metadata["tool_args_preview"]
    assert len(preview) == 201
    assert preview.endswith("…")
    assert preview.startswith('{"target": "xxx')
    assert recorder.seen[0].request.metadata["tool_args"] == {"target": long_target}


async def test_a_throwing_policy_denies_and_says_so(workspace: Path) -> None:
    CALLS.clear()

    def kaboom(ctx: PolicyContext) -> Any:
        raise RuntimeError("kaboom")

    runtime = call_then_report(ToolCall("purge", {"target": "a"}))
    app = governed_app(
        [Banker], runtime=runtime, workspace=workspace, policies=[Recorder("boom", kaboom)]
    )
    async with serve(app) as base, httpx2.AsyncClient(base_url=base, timeout=30) as client:
        frames = await post_prompt(client, PATH, "go")
    assert CALLS == []
    assert json.loads(frames[-1]["data"]["summary"])["message"] == (
        "Tool purge denied by policy 'boom': policy evaluation failed: kaboom"
    )


async def test_a_transform_rewrites_the_arguments_the_tool_runs_with(workspace: Path) -> None:
    CALLS.clear()

    def sandbox(ctx: PolicyContext) -> Any:
        args = dict(ctx.request.metadata.get("tool_args", {}))
        if ctx.request.metadata.get("tool_name") == "purge" and "target" in args:
            args["target"] = "sandbox/" + args["target"]
            return Transform(ctx.request.with_metadata(tool_args=args))
        return Transform(ctx.request)

    def breaks_schema(ctx: PolicyContext) -> Any:
        return Transform(ctx.request.with_metadata(tool_args={"target": ["not", "a", "string"]}))

    runtime = call_then_report(ToolCall("purge", {"target": "prod"}))
    app = governed_app(
        [Banker], runtime=runtime, workspace=workspace, policies=[Recorder("scope", sandbox)]
    )
    async with serve(app) as base, httpx2.AsyncClient(base_url=base, timeout=30) as client:
        frames = await post_prompt(client, PATH, "go")
    assert CALLS == ["purge sandbox/prod"]
    assert of_type(frames, "tool-start")[0]["data"]["arguments"] == {"target": "sandbox/prod"}

    runtime = call_then_report(ToolCall("purge", {"target": "prod"}))
    app = governed_app(
        [Banker], runtime=runtime, workspace=workspace, policies=[Recorder("bad", breaks_schema)]
    )
    async with serve(app) as base, httpx2.AsyncClient(base_url=base, timeout=30) as client:
        frames = await post_prompt(client, PATH, "go")
    assert CALLS == ["purge sandbox/prod"], "a rewrite that breaks the schema never runs"
    assert json.loads(frames[-1]["data"]["summary"])["error"] == "invalid_arguments"


async def test_post_response_sees_the_result_and_releases_what_admission_took(
    workspace: Path,
) -> None:
    class OneAtATime:
        name = "one-at-a-time"

        def __init__(self) -> None:
            self.active = 0
            self.results: list[str | None] = []

        def evaluate(self, ctx: PolicyContext) -> Any:
            if ctx.phase.value == "pre-admission":
                if self.active:
                    return Deny("busy")
                self.active += 1
            else:
                self.active -= 1
                self.results.append(ctx.accumulated_response)
            return Transform(ctx.request)

    limiter = OneAtATime()
    runtime = call_then_report(
        ToolCall("purge", {"target": "a"}), ToolCall("purge", {"target": "b"})
    )
    app = governed_app([Banker], runtime=runtime, workspace=workspace, policies=[limiter])
    async with serve(app) as base, httpx2.AsyncClient(base_url=base, timeout=30) as client:
        frames = await post_prompt(client, PATH, "go")
    assert frames[-1]["data"]["summary"] == "purged a | purged b"
    assert limiter.results == ["purged a", "purged b"]
    assert limiter.active == 0


async def test_bare_endpoints_are_governed_and_policies_installed_later_apply(
    workspace: Path,
) -> None:
    CALLS.clear()
    runtime = ScriptedRuntime(
        (),
        default=lambda request: (
            [ToolCall("purge", {"target": "x"})]
            if request.messages[-1].role == "user"
            else request.messages[-1].content
        ),
    )
    app = governed_app([BareChat], runtime=runtime, workspace=workspace)

    @app.post("/install")
    async def install(host: HarnessDep) -> None:
        policy_chain(host).install(deny_when("late", lambda ctx: True, "installed late"))

    async with serve(app) as base, httpx2.AsyncClient(base_url=base, timeout=30) as client:
        first = await post_prompt(client, "/atmosphere/bare-chat", "one")
        assert (await client.post("/install")).status_code == 200
        second = await post_prompt(client, "/atmosphere/bare-chat", "two")
    assert first[-1]["data"]["summary"] == "purged x"
    assert "installed late" in second[-1]["data"]["summary"]
    assert CALLS == ["purge x"]


# --- approvals ----------------------------------------------------------------------------------


def transfer_then_report() -> ScriptedRuntime:
    return call_then_report(ToolCall("transfer", {"amount": 5, "to": "bob"}))


async def _answer(client: httpx2.AsyncClient, approval_id: str, **body: Any) -> httpx2.Response:
    return await client.post(f"{PATH}/approvals/{approval_id}", json=body)


async def test_approve_runs_the_tool_with_the_reviewers_arguments(workspace: Path) -> None:
    CALLS.clear()
    app = governed_app([Banker], runtime=transfer_then_report(), workspace=workspace)
    async with serve(app) as base, httpx2.AsyncClient(base_url=base, timeout=30) as client:
        async with open_prompt(client, PATH, "pay bob") as reader:
            start = await reader.until("tool-start")
            asked = await reader.until("approval-required")
            data = asked["data"]
            assert set(data) == {"approvalId", "toolCallId", "tool", "arguments", "expiresAt"}
            assert data["tool"] == "transfer"
            assert data["toolCallId"] == start["data"]["toolCallId"]
            assert data["arguments"] == {"amount": 5, "to": "bob"}
            assert CALLS == [], "nothing runs before the answer"
            listed = await client.get(
                f"{PATH}/approvals", params={"conversationId": asked["conversationId"]}
            )
            assert [a["approvalId"] for a in listed.json()["approvals"]] == [data["approvalId"]]
            answered = await _answer(
                client, data["approvalId"], approve=True, arguments={"amount": 3, "to": "bob"}
            )
            assert answered.status_code == 200
            assert answered.json() == {"approvalId": data["approvalId"], "status": "approved"}
            rest = await reader.rest()
        again = await _answer(client, data["approvalId"], approve=False)
        unknown = await _answer(client, "0" * 32, approve=True)
    assert CALLS == ["transfer 3 bob"]
    assert of_type(rest, "tool-result")[0]["data"]["result"] == "sent 3 to bob"
    assert again.status_code == 409
    assert unknown.status_code == 404


def command_of(ctx: PolicyContext) -> str:
    return str(ctx.request.metadata.get("tool_args", {}).get("command", ""))


async def edit_the_approval(
    app: Any, arguments: dict[str, Any]
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Run `shell ls` on the operator; the approver approves it with `arguments` instead.
    Returns the `approval-required` frame and every frame after it."""
    async with (
        serve(app) as base,
        httpx2.AsyncClient(base_url=base, timeout=30) as client,
        open_prompt(client, OPERATOR, "tidy up") as reader,
    ):
        asked = await reader.until("approval-required")
        answered = await client.post(
            f"{OPERATOR}/approvals/{asked['data']['approvalId']}",
            json={"approve": True, "arguments": arguments},
        )
        assert answered.status_code == 200, answered.text
        return asked, await reader.rest()


async def test_arguments_an_approver_edits_pass_governance_again(workspace: Path) -> None:
    CALLS.clear()
    no_rm = deny_when("no-rm-rf", lambda ctx: "rm -rf" in command_of(ctx), "destructive command")
    runtime = call_then_report(ToolCall("shell", {"command": "ls"}))
    app = governed_app([Operator], runtime=runtime, workspace=workspace, policies=[no_rm])
    asked, rest = await edit_the_approval(app, {"command": "rm -rf /"})
    assert asked["data"]["arguments"] == {"command": "ls"}, "the model's call was admitted"
    assert CALLS == [], "the edited call never runs"
    denial = {
        "status": "cancelled",
        "message": "Tool shell denied by policy 'no-rm-rf': destructive command",
    }
    [result] = of_type(rest, "tool-result")
    assert result["data"]["toolCallId"] == asked["data"]["toolCallId"]
    assert json.loads(result["data"]["result"]) == denial
    assert json.loads(rest[-1]["data"]["summary"]) == denial, "the model got the denial"
    # The first admission is released before the edited call is judged.
    assert [(ctx.phase.value, command_of(ctx)) for ctx in no_rm.seen] == [
        ("pre-admission", "ls"),
        ("post-response", "ls"),
        ("pre-admission", "rm -rf /"),
    ]
    assert no_rm.seen[1].accumulated_response is None


async def test_an_admitted_edit_runs_as_the_policies_left_it(workspace: Path) -> None:
    CALLS.clear()

    class NiceAndCounted:
        """Prefixes every command with `nice` and counts admissions not yet released."""

        name = "nice"
        active = 0

        def evaluate(self, ctx: PolicyContext) -> Any:
            if ctx.phase.value == "post-response":
                self.active -= 1
                return Admit()
            self.active += 1
            command = command_of(ctx)
            if command.startswith("nice "):
                return Admit()
            args = {**ctx.request.metadata.get("tool_args", {}), "command": f"nice {command}"}
            return Transform(ctx.request.with_metadata(tool_args=args))

    policy = NiceAndCounted()
    runtime = call_then_report(ToolCall("shell", {"command": "ls"}))
    app = governed_app([Operator], runtime=runtime, workspace=workspace, policies=[policy])
    asked, rest = await edit_the_approval(app, {"command": "df"})
    assert asked["data"]["arguments"] == {"command": "nice ls"}
    assert CALLS == ["shell nice df"]
    assert of_type(rest, "tool-result")[0]["data"]["result"] == "ran nice df"
    assert policy.active == 0, "one release per admission"


async def test_edited_arguments_that_break_the_schema_never_run(workspace: Path) -> None:
    CALLS.clear()
    recorder = Recorder()
    runtime = call_then_report(ToolCall("shell", {"command": "ls"}))
    app = governed_app([Operator], runtime=runtime, workspace=workspace, policies=[recorder])
    _, rest = await edit_the_approval(app, {"command": ["not", "text"]})
    assert CALLS == []
    result = json.loads(of_type(rest, "tool-result")[0]["data"]["result"])
    assert result["error"] == "invalid_arguments"
    # Only the model's call was judged (and released with the answer the model got).
    assert [(ctx.phase.value, command_of(ctx)) for ctx in recorder.seen] == [
        ("pre-admission", "ls"),
        ("post-response", "ls"),
    ]
    assert (
        recorder.seen[1].accumulated_response == of_type(rest, "tool-result")[0]["data"]["result"]
    )


async def test_deny_answers_action_cancelled_by_user(workspace: Path) -> None:
    CALLS.clear()
    app = governed_app([Banker], runtime=transfer_then_report(), workspace=workspace)
    async with (
        serve(app) as base,
        httpx2.AsyncClient(base_url=base, timeout=30) as client,
        open_prompt(client, PATH, "pay bob") as reader,
    ):
        asked = await reader.until("approval-required")
        answered = await _answer(client, asked["data"]["approvalId"], approve=False)
        assert answered.json()["status"] == "denied"
        rest = await reader.rest()
    assert CALLS == []
    result = json.loads(of_type(rest, "tool-result")[0]["data"]["result"])
    assert result == {"status": "cancelled", "message": "Action cancelled by user"}


async def test_no_answer_in_time_is_approval_timed_out(workspace: Path) -> None:
    CALLS.clear()
    app = governed_app(
        [Banker], runtime=transfer_then_report(), workspace=workspace, approval_timeout=0.3
    )
    async with serve(app) as base, httpx2.AsyncClient(base_url=base, timeout=30) as client:
        async with open_prompt(client, PATH, "pay bob") as reader:
            asked = await reader.until("approval-required")
            rest = await reader.rest()
        late = await _answer(client, asked["data"]["approvalId"], approve=True)
    assert CALLS == []
    result = json.loads(of_type(rest, "tool-result")[0]["data"]["result"])
    assert result == {"status": "timeout", "message": "Approval timed out"}
    assert late.status_code == 404, "an expired approval is unknown"


async def test_deny_all_and_custom_approval_policies(workspace: Path) -> None:
    CALLS.clear()
    runtime = call_then_report(ToolCall("purge", {"target": "a"}))
    app = governed_app(
        [Banker],
        runtime=runtime,
        workspace=workspace,
        approval_policy=ToolApprovalPolicy.deny_all(),
    )
    async with serve(app) as base, httpx2.AsyncClient(base_url=base, timeout=30) as client:
        frames = await post_prompt(client, PATH, "go")
    assert json.loads(frames[-1]["data"]["summary"]) == {
        "status": "cancelled",
        "message": "Tool execution denied by policy",
    }
    assert of_type(frames, "approval-required") == []
    assert CALLS == []

    gate_deletes = ToolApprovalPolicy.custom(lambda tool: tool.kind is ToolKind.DELETE)
    runtime = call_then_report(ToolCall("purge", {"target": "a"}))
    app = governed_app([Banker], runtime=runtime, workspace=workspace, approval_policy=gate_deletes)
    async with (
        serve(app) as base,
        httpx2.AsyncClient(base_url=base, timeout=30) as client,
        open_prompt(client, PATH, "go") as reader,
    ):
        asked = await reader.until("approval-required")
        assert asked["data"]["tool"] == "purge"
        await _answer(client, asked["data"]["approvalId"], approve=True)
        await reader.rest()
    assert CALLS == ["purge a"]


async def test_a_run_waiting_for_approval_outlives_its_connection(workspace: Path) -> None:
    CALLS.clear()
    app = governed_app([Banker], runtime=transfer_then_report(), workspace=workspace)
    async with serve(app) as base, httpx2.AsyncClient(base_url=base, timeout=30) as client:
        async with open_prompt(client, PATH, "pay bob", conversation_id="reconnect") as reader:
            asked = await reader.until("approval-required")
        # The stream is gone; the run waits for its approval regardless.
        await asyncio.sleep(0.3)
        listed = await client.get(f"{PATH}/approvals", params={"conversationId": "reconnect"})
        assert [a["approvalId"] for a in listed.json()["approvals"]] == [
            asked["data"]["approvalId"]
        ]
        answered = await _answer(client, asked["data"]["approvalId"], approve=True)
        assert answered.status_code == 200
        params = {"sessionId": asked["sessionId"]}
        headers = {"Last-Event-ID": str(asked["seq"])}
        async with client.stream(
            "GET", f"{PATH}/conversations/reconnect/events", params=params, headers=headers
        ) as response:
            assert response.status_code == 200
            rest = await FrameReader(response).rest()
        # A fresh attach without an id replays the whole (finished) run.
        async with client.stream("GET", f"{PATH}/conversations/reconnect/events") as response:
            replay = await FrameReader(response).rest()
        missing = await client.get(f"{PATH}/conversations/nobody/events")
    assert CALLS == ["transfer 5 bob"]
    assert rest[0]["seq"] == asked["seq"] + 1
    assert [f["event"] for f in rest if f["event"] != "text"] == ["tool-result", "complete"]
    assert rest[-1]["data"]["summary"] == "sent 5 to bob"
    assert [f["seq"] for f in replay] == list(range(1, rest[-1]["seq"] + 1))
    assert missing.status_code == 404


async def test_approvals_and_runs_belong_to_their_user(workspace: Path) -> None:
    app = governed_app([Banker], runtime=transfer_then_report(), workspace=workspace)
    app.dependency_overrides[get_user_id] = user_id_from_header
    ann, bob = {"X-User-Id": "ann"}, {"X-User-Id": "bob"}
    async with (
        serve(app) as base,
        httpx2.AsyncClient(base_url=base, timeout=30) as client,
        open_prompt(client, PATH, "pay", conversation_id="mine", headers=ann) as reader,
    ):
        asked = await reader.until("approval-required")
        approval = f"{PATH}/approvals/{asked['data']['approvalId']}"
        foreign = await client.post(approval, json={"approve": True}, headers=bob)
        hidden = await client.get(
            f"{PATH}/approvals", params={"conversationId": "mine"}, headers=bob
        )
        follow = await client.get(f"{PATH}/conversations/mine/events", headers=bob)
        own = await client.post(approval, json={"approve": False}, headers=ann)
        await reader.rest()
    assert foreign.status_code == 404, "another user's approval is not disclosed"
    assert hidden.status_code == 404, "nor is another user's conversation"
    assert follow.status_code == 404
    assert own.status_code == 200
