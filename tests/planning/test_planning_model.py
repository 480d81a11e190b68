"""AgentPlan, PlanStep, PlanStatus: copies, Markdown, wire and stored forms (AgentPlanTest)."""

from __future__ import annotations

import json

import pytest

from atmosphere_harness import AgentPlan, PlanStatus, PlanStep

EXAMPLE = AgentPlan(
    [
        PlanStep("Write tests", PlanStatus.COMPLETED),
        PlanStep("Fix bug", PlanStatus.IN_PROGRESS, "Fixing bug"),
        PlanStep("Update docs", PlanStatus.PENDING, "Updating docs"),
        PlanStep("Gold-plate", PlanStatus.ABANDONED),
    ],
    "Ship it",
)


def test_steps_are_a_defensive_copy() -> None:
    steps = [PlanStep("a"), PlanStep("b")]
    plan = AgentPlan(steps)
    steps.append(PlanStep("c"))
    assert isinstance(plan.steps, tuple)
    assert [step.content for step in plan.steps] == ["a", "b"]


def test_none_steps_become_empty_and_blank_goal_none() -> None:
    plan = AgentPlan(None, "  ")  # type: ignore[arg-type]
    assert plan.steps == ()
    assert plan.goal is None


@pytest.mark.parametrize("content", ["", "   ", None, 3])
def test_blank_or_non_text_content_is_rejected(content: object) -> None:
    with pytest.raises(ValueError, match="non-empty content"):
        PlanStep(content)  # type: ignore[arg-type]


def test_default_status_is_pending_and_blank_active_form_is_dropped() -> None:
    step = PlanStep("a", active_form="  ")
    assert step.status is PlanStatus.PENDING
    assert step.active_form is None
    assert PlanStep.from_wire({"content": "a"}).status is PlanStatus.PENDING
    assert PlanStep.from_wire({"content": "a", "status": None}).status is PlanStatus.PENDING


def test_markdown_markers_are_exact() -> None:
    assert EXAMPLE.to_markdown() == (
        "Goal: Ship it\n- [x] Write tests\n- [~] Fixing bug\n- [ ] Update docs\n- [-] Gold-plate"
    )


def test_active_form_only_shows_for_the_step_in_progress() -> None:
    plan = AgentPlan([PlanStep("Run tests", PlanStatus.IN_PROGRESS)])
    assert plan.to_markdown() == "- [~] Run tests"
    assert AgentPlan([PlanStep("Run", PlanStatus.COMPLETED, "Running")]).to_markdown() == (
        "- [x] Run"
    )


def test_empty_plan_reads_no_steps() -> None:
    assert AgentPlan().to_markdown() == "(no steps)"
    assert AgentPlan((), "Ship it").to_markdown() == "Goal: Ship it\n(no steps)"


def test_wire_steps_are_lower_case_ordered_and_omit_a_missing_active_form() -> None:
    assert EXAMPLE.wire_steps() == [
        {"content": "Write tests", "status": "completed"},
        {"content": "Fix bug", "status": "in_progress", "activeForm": "Fixing bug"},
        {"content": "Update docs", "status": "pending", "activeForm": "Updating docs"},
        {"content": "Gold-plate", "status": "abandoned"},
    ]


def test_plan_update_payload_carries_ids_and_is_a_copy() -> None:
    payload = EXAMPLE.to_wire(conversation_id="c-1", agent_id="assistant")
    assert payload == {
        "steps": EXAMPLE.wire_steps(),
        "goal": "Ship it",
        "conversationId": "c-1",
        "agentId": "assistant",
    }
    payload["steps"].clear()
    payload["steps"].append({"content": "hacked"})
    assert len(EXAMPLE.wire_steps()) == 4
    assert AgentPlan().to_wire(conversation_id="c", agent_id="a")["goal"] is None


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("pending", PlanStatus.PENDING),
        ("todo", PlanStatus.PENDING),
        (None, PlanStatus.PENDING),
        ("", PlanStatus.PENDING),
        ("in_progress", PlanStatus.IN_PROGRESS),
        ("In-Progress", PlanStatus.IN_PROGRESS),
        (" inprogress ", PlanStatus.IN_PROGRESS),
        ("ACTIVE", PlanStatus.IN_PROGRESS),
        ("doing", PlanStatus.IN_PROGRESS),
        ("completed", PlanStatus.COMPLETED),
        ("Complete", PlanStatus.COMPLETED),
        ("done", PlanStatus.COMPLETED),
        ("finished", PlanStatus.COMPLETED),
        ("abandoned", PlanStatus.ABANDONED),
        ("cancelled", PlanStatus.ABANDONED),
        ("canceled", PlanStatus.ABANDONED),
        ("SKIPPED", PlanStatus.ABANDONED),
        (PlanStatus.COMPLETED, PlanStatus.COMPLETED),
    ],
)
def test_status_parsing_is_lenient(raw: object, expected: PlanStatus) -> None:
    assert PlanStatus.parse(raw) is expected


@pytest.mark.parametrize("raw", ["wip", "blocked", "half-done", "1"])
def test_unknown_status_parses_to_none_so_callers_decide(raw: str) -> None:
    assert PlanStatus.parse(raw) is None
    with pytest.raises(ValueError, match="unknown plan status"):
        PlanStep.from_wire({"content": "a", "status": raw})


def test_stored_form_round_trips_every_status() -> None:
    text = EXAMPLE.to_json()
    assert json.loads(text) == {"goal": "Ship it", "steps": EXAMPLE.wire_steps()}
    assert AgentPlan.from_json(text) == EXAMPLE
    assert AgentPlan.from_json(text.encode()) == EXAMPLE
    assert AgentPlan.from_json(AgentPlan().to_json()) == AgentPlan()


def test_reads_the_reference_frameworks_stored_form() -> None:
    """Upper-case enum names and explicit nulls, as Jackson writes them."""
    document = (
        '{"goal":null,"steps":[{"content":"a","status":"IN_PROGRESS","activeForm":"Doing a"},'
        '{"content":"b","status":"ABANDONED","activeForm":null},{"content":"c"}]}'
    )
    plan = AgentPlan.from_json(document)
    assert plan.goal is None
    assert [(s.content, s.status, s.active_form) for s in plan.steps] == [
        ("a", PlanStatus.IN_PROGRESS, "Doing a"),
        ("b", PlanStatus.ABANDONED, None),
        ("c", PlanStatus.PENDING, None),
    ]


@pytest.mark.parametrize(
    "document",
    ["[]", '"plan"', '{"steps": 3}', '{"steps": [1]}', '{"steps": [{"content": ""}]}', "{"],
)
def test_documents_that_are_not_plans_raise_value_error(document: str) -> None:
    with pytest.raises(ValueError):
        AgentPlan.from_json(document)
