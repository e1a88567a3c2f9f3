"""Bad input: empty and huge questions get a clear error or a recorded, bounded prompt."""

from __future__ import annotations

from pathlib import Path

import pytest
from langchain_core.tools import tool

from fakes import FakeChatModel, ScriptedPolicy, plan
from flowlearn.cli import main
from flowlearn.engine.batching import BatchingPolicy
from flowlearn.engine.local import HFPolicy
from flowlearn.engine.sampling import Sampling
from flowlearn.evals.cases import Case
from flowlearn.evals.scorers import exact_match
from flowlearn.graphs import Context, build_agentflow
from flowlearn.training import TrajectoryStore, collect

WINDOW = 256
HUGE = "Please consider " + "this very long preamble " * 2_000 + "and then say: what is 2 + 2?"


@tool
def calculator(query: str) -> str:
    """Compute an arithmetic expression."""
    return "4"


def engine() -> FakeChatModel:
    return FakeChatModel(default_args={"query": "2+2"}, text="Conclusion: STOP <answer>4</answer>")


@pytest.mark.parametrize("batched", [False, True])
def test_a_huge_question_is_cut_to_the_window_with_a_note(
    tiny_model_dir: Path, batched: bool
) -> None:
    policy = HFPolicy.from_pretrained(tiny_model_dir, device="cpu")
    policy = HFPolicy(policy.model, policy.tokenizer, context_window=WINDOW)
    if batched:
        policy = BatchingPolicy(policy, max_wait_s=0.0)
    graph = build_agentflow(policy, engine(), [calculator])
    context = Context(max_turns=1, planner_max_new_tokens=16)
    state = graph.invoke({"question": HUGE}, context=context)
    turns = [t for t in state["transitions"] if t.get("completion_ids") is not None]
    assert turns, "the policy was called"
    full = policy.encode_chat(turns[0]["messages"])
    for turn in turns:
        ids = turn["prompt_ids"]
        assert len(ids) + 16 == WINDOW  # cut to fit exactly, completion budget kept
        assert ids[:120] == full[:120] and ids[-120:] == full[-120:]  # head and tail kept
        (note,) = turn["notes"]
        assert "prompt truncated" in note and f"{WINDOW}-token window" in note
    assert state["answer"] == "4"  # the run went on to its answer


def test_a_prompt_that_fits_is_not_touched_or_noted(tiny_model_dir: Path) -> None:
    policy = HFPolicy.from_pretrained(tiny_model_dir, device="cpu")
    messages = [{"role": "user", "content": "What is 2 + 2?"}]
    generation = policy.generate(messages, Sampling(max_new_tokens=4, seed=0))
    assert generation.prompt_ids == policy.encode_chat(messages)
    assert generation.notes == []


def test_a_token_budget_that_leaves_no_room_is_an_error(tiny_model_dir: Path) -> None:
    policy = HFPolicy.from_pretrained(tiny_model_dir, device="cpu")
    policy = HFPolicy(policy.model, policy.tokenizer, context_window=WINDOW)
    with pytest.raises(ValueError, match="lower max_new_tokens"):
        policy.generate([{"role": "user", "content": HUGE}], Sampling(max_new_tokens=WINDOW))


@pytest.mark.parametrize("question", ["", "   \n\t"])
def test_an_empty_question_is_a_clear_error(question: str, tmp_path: Path) -> None:
    graph = build_agentflow(ScriptedPolicy([plan("calculator")]), engine(), [calculator])
    with pytest.raises(ValueError, match="question is empty"):
        graph.invoke({"question": question}, context=Context(max_turns=1))
    store = TrajectoryStore(tmp_path / "t.jsonl")
    cases = [Case("ok", "What is 2 + 2?", "4"), Case("blank", question, "4")]
    with pytest.raises(ValueError, match=r"\['blank'\] have an empty query"):
        collect(graph, cases, lambda a, c: exact_match(a, [c.reference]), group_size=1, store=store)
    assert not store.path.exists() or store.path.read_text() == ""  # nothing ran


def test_an_empty_question_on_the_command_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "  "]) == 2
    assert "the question is empty" in capsys.readouterr().err
