"""Two roles learn together: a planner adapter the right tool, a verifier adapter when to stop.

The task is `learning.task`'s (arithmetic needs `python`, capitals need `local_search`; the
scripted engine fills tool arguments and answers from the memory's last result that found
something), but the verifier is no longer the engine's: it is a LoRA adapter of its own on the
same tiny base as the planner's (`flowlearn.training.roles.with_node_adapters`), called through
the real AgentFlow graph (`verifier_policy`), and trained with the planner by Flow-GRPO from one
outcome (`train_nodes: [planner, verifier]`, each node's rows and advantages built alone).

A rollout has up to two turns. A result lacks what the question needs when the tool was the
wrong one (python prints `unknown` for a capital; a search for a sum's expression finds no
passage) or when the call found nothing: in training, one tool call in three does
(`FAIL_SHARE`), as a flaky service would. The reward is the outcome, a success in two turns
counting 0.75 (`learning.task.turn_discount`), less a penalty for verifier replies with no
clear verdict (`format_penalty` over the verifier's calls; an unclear reply means CONTINUE). So:
- the planner earns most with the right tool first;
- the verifier earns most with STOP when the last result holds what the question needs
  (`learning.task.has_needed`) and CONTINUE when it does not.

The base is warmed up (supervised, every weight) on both output formats with random choices:
the planner's (`learning.warmup.FORMAT`) and the verifier's `Conclusion: STOP|CONTINUE`, on
prompts the real flow rendered; so both roles start near chance. Then each role gets its
adapter, both starting as the base.

Held out: 40 distinct questions training never saw (`learning.task.held_out_cases`: 20 sums of
numbers from 60 to 99, the capitals of 20 countries in no training question, each once).
Measured greedy, before and after training, with a tool that never fails: the planner's first
tool through the flow; the verifier's verdict on each held-out question after a right result
(STOP is right), after the right tool's call found nothing (CONTINUE) and after the wrong tool
(CONTINUE).

What it took: steps of 8 questions x 8 rollouts, capitals of 30 training countries, at most 80
steps, stopping once the sampled rollouts show both roles learned (`learned`). Three runs: one
of 80 steps (16 minutes on a slow 2-core machine; its curve meets the stop rule at step 36), and
two with the stop rule, stopped at steps 49 and 41 (about 10.5 minutes each on that machine),
held-out right first tool 1.00 in all three, STOP after a found answer 1.00, 0.80 and 1.00.
With the 15 countries of the planner-only test the planner's held-out
first tool ended at 0.80 in two runs of 60 steps and 0.88 in one of three of 80 (capitals of
the unseen countries sent to python first while training's first tool was right 0.91-0.98);
with 30 (`MORE_CAPITALS`), 1.00 in two runs of 80. With the
settings of the planner-only test (planner learning rate 1e-2, the verifier's 3e-3 to 1e-2,
no failed calls, the product's verifier prompt) the verifier ended on one verdict for every
held-out prompt in each of 17 runs, whatever the KL weight (0.04 to 0.5), turn cost or step
credit. Measured in the rows: while the planner is at chance, a verifier row's advantage
carries the planner's choice (a STOP after a right result +2.2, a STOP after a wrong one -1.3,
a CONTINUE after a wrong one only +0.2, since the planner's second tool was right one time in
two), so STOP rose in both states before the states separated; and once the planner learned,
wrong results all but vanished and nothing taught CONTINUE. What changed, each measured:
- calls that find nothing (`FAIL_SHARE`): results to CONTINUE on stay in every step;
- a slower planner (1.5e-3) than verifier (3e-3): the verifier learns while the planner still
  errs (at 1e-2 the verifier's held-out verdicts followed the question's kind, not the result);
- the verifier's prompt with the memory last (`VERIFIER_PROMPT`): a two-layer model reads the
  last result next to where it writes;
- digits and `unknown` kept whole (`KEPT_WORDS`): held-out sums made of new number tokens were
  judged STOP after failed calls (20 of 20) until their digits were tokens training had seen;
- the held-out countries' passages first in the corpus, so that searches list them after the
  match and their names are not untrained tokens on held-out questions: with it, capitals of
  the unseen countries were judged right 12 of 20 in four runs and 20 of 20 in one; without
  it, 12 and 0 of 20 in two.
"""

from __future__ import annotations

import dataclasses
import os
import random
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("peft")

from peft import LoraConfig
from transformers import AutoModelForCausalLM, TrainerCallback

from flowlearn.engine.adapters import NodePolicies, node_policies
from flowlearn.engine.local import HFPolicy
from flowlearn.engine.sampling import Generation, Messages, Sampling
from flowlearn.evals.benchmarks import score_case
from flowlearn.evals.cases import Case
from flowlearn.evals.harness import run_eval
from flowlearn.evals.scorers import Score
from flowlearn.graphs import Context, build_agentflow
from flowlearn.nodes.parsing import parse_verdict
from flowlearn.nodes.smollm2 import SMOLLM2_PROMPTS
from flowlearn.nodes.tools import local_search_tool, python_tool
from flowlearn.training.config import FlowGRPOConfig
from flowlearn.training.roles import with_node_adapters
from flowlearn.training.rollouts import format_penalty
from flowlearn.training.trainer import FlowGRPOTrainer
from learning.task import (
    ALL_CAPITALS,
    HELD_OUT_COUNTRIES,
    MORE_CAPITALS,
    TRAIN_COUNTRIES,
    has_needed,
    held_out_cases,
    make_cases,
    scripted_engine,
    turn_discount,
    write_corpus,
)
from learning.warmup import (
    FORMAT,
    TOOLS,
    VERDICT_FORMAT,
    VERDICTS,
    WORDS,
    build_policy,
    random_verdict,
    warm_up,
)

pytestmark = pytest.mark.slow  # minutes of training on 2 CPU cores

NODES = ["planner", "verifier"]
VERIFIER_TOKENS = 8
"""The verifier's budget: `Conclusion: STOP` and the end are a few tokens."""
VERIFIER_PROMPT = """\
Judge whether the memory holds enough to answer the question, then end with exactly one line:
Conclusion: STOP    (if the memory is enough to answer)
Conclusion: CONTINUE    (if more steps are needed)

Question: {question}

Memory of previous steps:
{memory}"""
PROMPTS = dataclasses.replace(
    SMOLLM2_PROMPTS,
    verifier=VERIFIER_PROMPT,
    budgets=dataclasses.replace(SMOLLM2_PROMPTS.budgets, verifier=VERIFIER_TOKENS),
)
"""The planner-only test's prompts (tool name first, prefilled), the verifier's own."""
KEPT_WORDS = [*WORDS, *VERDICTS, *"0123456789", "unknown"]
SEED = int(os.environ.get("FLOWLEARN_TEST_SEED", "0"))
"""Seeds the tokenizer's texts, the weights, the warm-up and every sampled call of the rollouts
(each call derives its own seed from it). A failure prints it; `FLOWLEARN_TEST_SEED=N` reruns."""
STEPS = 80
"""At most; training stops once both roles have learned (`learned`)."""
STOP_WINDOW = 5
MAX_TURNS = 2
MAX_NEW_TOKENS = 32
LORA = LoraConfig(r=16, lora_alpha=32, target_modules="all-linear", task_type="CAUSAL_LM")
PLANNER_LEARNING_RATE = 1.5e-3
VERIFIER_LEARNING_RATE = 3e-3
WARM_UP_STEPS = 200
WARM_UP_BATCH = 8
SEARCH_K = 3
QUESTIONS_PER_STEP = 8
GENERATIONS = 8
BETA = 0.2
TURN_DISCOUNT = 0.25
UNCLEAR_PENALTY = 0.5
FAIL_SHARE = 0.33
COUNTRIES = [*TRAIN_COUNTRIES, *MORE_CAPITALS]
"""Training capitals: 30 countries, so that the planner's choice rests on the question's
form, not on which country it names."""


def needed_tool(question: str) -> str:
    return "python" if "+" in question else "local_search"


class Recorder:
    """A policy that writes random replies in its role's format and records its prompts."""

    continues_prefill = True  # as the HF policy it stands in for: prompts end in the prefill

    def __init__(self, write: Callable[[random.Random], str]) -> None:
        self.write = write
        self.prompts: list[Messages] = []
        self.rng = random.Random(SEED)

    def generate(self, messages: Messages, sampling: Sampling, **kwargs: Any) -> Generation:
        self.prompts.append(messages)
        return Generation(text=self.write(self.rng))


def bare_plan(rng: random.Random) -> str:
    """A planner reply with a random tool and no filler (`learning.warmup.random_plan` adds
    filler words)."""
    return FORMAT.format(filler="", tool=rng.choice(TOOLS))


def forced_plan(tool: str) -> Callable[[random.Random], str]:
    return lambda rng: FORMAT.format(filler="", tool=tool)


def first_turn(trajectory: Any) -> tuple[str, bool, str] | None:
    """The first tool, whether its result holds what the question needs, and the verdict."""
    memory = trajectory.memory
    action = next((m for m in memory if m.get("kind") == "action"), None)
    if action is None:
        return None
    verdict = next((m["verdict"] for m in memory if m.get("kind") == "verification"), "")
    found = has_needed(trajectory.question, str(action.get("result") or ""))
    return str(action["tool"]), found, verdict


class RoleTally(TrainerCallback):
    """A rollout store and callback: per step, the share of rollouts with the right first tool
    and of first verdicts that were right, after a result holding the answer and after one
    lacking it (sampled). It stops training once both roles have learned (`learned`)."""

    def __init__(self) -> None:
        self.step: Counter[str] = Counter()
        self.history: list[tuple[float, float, float, float]] = []

    def __iter__(self) -> Any:  # nothing stored to reuse
        return iter(())

    def append(self, trajectory: Any) -> None:
        turn = first_turn(trajectory)
        self.step["rollouts"] += 1
        if turn is None:
            return
        tool, found, verdict = turn
        self.step["first_right"] += tool == needed_tool(trajectory.question)
        kind = "found" if found else "lacking"
        self.step[kind] += 1
        self.step[f"{kind}_ok"] += verdict == ("STOP" if found else "CONTINUE")

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
        if not logs or "flow/mean_reward" not in logs:
            return
        s, self.step = self.step, Counter()
        self.history.append(
            (
                s["first_right"] / max(s["rollouts"], 1),
                s["found_ok"] / max(s["found"], 1),
                s["lacking_ok"] / max(s["lacking"], 1),
                float(logs["flow/mean_reward"]),
            )
        )
        if learned(self.history):
            control.should_training_stop = True


def learned(history: list[tuple[float, float, float, float]]) -> bool:
    """Whether, over the last `STOP_WINDOW` steps' sampled rollouts, the first tool was right
    at least 0.95 of the time, STOP followed a found answer at least 0.85 and CONTINUE a
    lacking result at least 0.9 (means over the window)."""
    if len(history) < STOP_WINDOW:
        return False
    first, found, lacking = (
        sum(step[i] for step in history[-STOP_WINDOW:]) / STOP_WINDOW for i in range(3)
    )
    return first >= 0.95 and found >= 0.85 and lacking >= 0.9


def scorer(answer: str, case: Case) -> Score:
    return score_case("exact_match", answer, case)


def greedy(max_turns: int) -> Context:
    return Context(
        max_turns=max_turns, planner_temperature=0.0, planner_max_new_tokens=MAX_NEW_TOKENS
    )


def first_tool_accuracy(policies: NodePolicies, tools: Any, cases: list[Case]) -> float:
    """Greedy through the flow, both roles trained: the share of `cases` whose first tool is
    the right one."""
    flow = build_agentflow(
        policies["planner"],
        scripted_engine(search_sums=True, skip_failed=True),
        tools,
        prompts=PROMPTS,
        verifier_policy=policies["verifier"],
    )
    results = run_eval(flow, cases, scorer, concurrency=1, progress=False, context=greedy(2))
    outcomes = Counter((tuple(r.tools), r.format_errors, r.score) for r in results)
    print(f"held-out flow: (tools, format errors, score) {dict(outcomes)}")
    return sum(r.tools[:1] == [needed_tool(r.query)] for r in results) / len(results)


def verifier_prompts(tools: Any, cases: list[Case]) -> dict[str, list[Messages]]:
    """The verifier's prompt on each case after one forced first turn: a right result, the
    right tool's call finding nothing, and the wrong tool."""
    prompts: dict[str, list[Messages]] = {"found": [], "failed": [], "wrong tool": []}
    for case in cases:
        right = needed_tool(case.query)
        wrong = next(t for t in TOOLS if t != right)
        for kind, tool, fail in (
            ("found", right, 0.0),
            ("failed", right, 1.0),
            ("wrong tool", wrong, 0.0),
        ):
            recorder = Recorder(random_verdict)
            flow = build_agentflow(
                Recorder(forced_plan(tool)),
                scripted_engine(search_sums=True, fail_share=fail),
                tools,
                prompts=PROMPTS,
                verifier_policy=recorder,
            )
            state = flow.invoke({"question": case.query}, context=greedy(1))
            action = next(m for m in state["memory"] if m.get("kind") == "action")
            assert has_needed(case.query, str(action.get("result") or "")) == (kind == "found")
            prompts[kind].append(recorder.prompts[-1])
    return prompts


def verdict_accuracy(
    policies: NodePolicies, prompts: dict[str, list[Messages]]
) -> dict[str, float]:
    """The share of right greedy verdicts of each kind: STOP after a right result, CONTINUE
    after the others (a reply with no clear verdict counts as wrong)."""
    sampling = dataclasses.replace(greedy(1).planner_sampling(), max_new_tokens=VERIFIER_TOKENS)
    shares, seen = {}, Counter()
    for kind, chats in prompts.items():
        right = "STOP" if kind == "found" else "CONTINUE"
        for messages in chats:
            verdict, clear = parse_verdict(policies["verifier"].generate(messages, sampling).text)
            seen[(kind, verdict if clear else "unclear")] += 1
        shares[kind] = seen[(kind, right)] / len(chats)
    print(f"held-out verdicts: {dict(seen)}")
    return shares


def warmed_up_base(tmp_path: Path, tools: Any, cases: list[Case]) -> Any:
    """The tiny base warmed up on both roles' formats, on prompts the real flow rendered."""
    planner, verifier = Recorder(bare_plan), Recorder(random_verdict)
    engine = scripted_engine(search_sums=True, skip_failed=True)
    recording = build_agentflow(planner, engine, tools, prompts=PROMPTS, verifier_policy=verifier)
    for case in cases:
        recording.invoke({"question": case.query}, context=Context(max_turns=MAX_TURNS))
    texts = [m["content"] for messages in planner.prompts + verifier.prompts for m in messages]
    texts += ["Tool Name:" + FORMAT.format(filler="", tool=t) for t in TOOLS] * 20
    texts += [VERDICT_FORMAT.format(verdict=v) for v in VERDICTS] * 20
    texts += list(ALL_CAPITALS)  # every country's name one token, as a pretrained tokenizer has it
    model, tokenizer = build_policy(tmp_path / "policy", texts, SEED, words=KEPT_WORDS)
    examples = [
        example
        for pair in zip(planner.prompts, verifier.prompts, strict=False)
        for example in ((pair[0], bare_plan), (pair[1], random_verdict))
    ]
    warm_up(model, tokenizer, examples, steps=WARM_UP_STEPS, batch_size=WARM_UP_BATCH, seed=SEED)
    # Saved and reloaded, so the adapters start from the warmed-up weights on disk.
    model.save_pretrained(tmp_path / "warm")
    tokenizer.save_pretrained(tmp_path / "warm")
    return AutoModelForCausalLM.from_pretrained(tmp_path / "warm"), tokenizer


def test_planner_and_verifier_adapters_learn_together_from_one_outcome(tmp_path: Path) -> None:
    corpus = write_corpus(tmp_path / "corpus.jsonl", first=HELD_OUT_COUNTRIES, more=True)
    tools = [python_tool(), local_search_tool(corpus, k=SEARCH_K)]
    train_cases = make_cases(64, 0, shuffle=False, countries=COUNTRIES)
    held_out = held_out_cases()
    assert not {c.query for c in train_cases} & {c.query for c in held_out}
    base, tokenizer = warmed_up_base(tmp_path, tools, train_cases)
    model = with_node_adapters(base, {node: LORA for node in NODES})

    def policies() -> NodePolicies:
        return node_policies(HFPolicy(model, tokenizer), NODES)

    judged = verifier_prompts(tools, held_out)
    first_before = first_tool_accuracy(policies(), tools, held_out)
    before = verdict_accuracy(policies(), judged)
    start = f"seed {SEED} (rerun: FLOWLEARN_TEST_SEED={SEED})"
    assert 0.3 <= first_before <= 0.7, (
        f"{start}: the planner should start near chance: {first_before}"
    )
    assert min(before.values()) <= 0.7, f"{start}: the verifier should start near chance: {before}"

    args = FlowGRPOConfig(
        output_dir=str(tmp_path / "out"),
        train_nodes=NODES,
        node_settings={"verifier": {"learning_rate": VERIFIER_LEARNING_RATE}},
        questions_per_step=QUESTIONS_PER_STEP,
        num_generations=GENERATIONS,
        max_steps=STEPS,
        learning_rate=PLANNER_LEARNING_RATE,
        lr_scheduler_type="constant_with_warmup",
        warmup_steps=3,
        adam_epsilon=1e-5,
        temperature=1.0,
        beta=BETA,  # KL to the warmed-up base: keeps the formats while the choices move
        max_completion_length=MAX_NEW_TOKENS,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        use_cpu=True,
        bf16=False,
        seed=SEED,
        shuffle_dataset=False,  # alternating cases: every step takes 4 of each kind
        step_credit_weight=1.0,
        step_credit_gamma=1.0,
    )
    tally = RoleTally()
    trainer = FlowGRPOTrainer.online(
        model,
        args=args,
        engine=scripted_engine(search_sums=True, skip_failed=True, fail_share=FAIL_SHARE),
        tools=tools,
        prompts=PROMPTS,
        scorer=scorer,
        cases=train_cases,
        context=Context(
            max_turns=MAX_TURNS,
            planner_temperature=1.0,
            planner_max_new_tokens=MAX_NEW_TOKENS,
            seed=SEED,
        ),
        processing_class=tokenizer,
        nodes=NODES,
        extra_rewards={
            "turns": turn_discount(TURN_DISCOUNT),
            "verdict_format": format_penalty(UNCLEAR_PENALTY, ["verifier"]),
        },
        callbacks=[tally],
        rollout_store=tally,
    )
    trainer.train()

    first_after = first_tool_accuracy(policies(), tools, held_out)
    after = verdict_accuracy(policies(), judged)
    logs = [h for h in trainer.state.log_history if "flow/mean_reward" in h]
    rows = {node: [h.get(f"flow/{node}/rows", 0) for h in logs] for node in NODES}
    curve = [tuple(round(v, 2) for v in h) for h in tally.history]
    changes = {kind: f"{before[kind]:.2f} -> {after[kind]:.2f}" for kind in after}
    report = (
        f"seed {SEED} (rerun: FLOWLEARN_TEST_SEED={SEED} pytest {__file__}); "
        f"held-out right first tool {first_before:.2f} -> {first_after:.2f}; right verdicts "
        f"{changes}; {len(logs)} steps; per step (first tool right, STOP after a found "
        f"answer, CONTINUE after none, reward) {curve}"
    )
    print(report)
    assert all(r > 0 for node in NODES for r in rows[node]), report  # both roles trained
    assert first_after >= 0.9, f"right first tool (chance 0.5): {report}"
    # Measured after training, in five runs of 60 steps: 0.80 to 1.00 STOP after a right
    # result (sums 20 of 20, capitals of the unseen countries 12 of 20 in four runs, 20 in
    # one), 1.00 CONTINUE after a failed call, 0.50 to 1.00 after the wrong tool (a mistake
    # the planner stops making early); in two of 80 steps and 30 countries, 0.88 and 1.00
    # STOP, 1.00 CONTINUE after a failed call, 0.78 and 1.00 after the wrong tool. Before
    # training, one verdict for every prompt. With 20 held-out countries, each once, and
    # seeded rollouts (seed 0, 2026-12-07): stopped at step 59 (22 minutes beside other jobs);
    # STOP after a right result 0.00 -> 1.00 (all 20 countries), CONTINUE after a failed call
    # and after the wrong tool 1.00 -> 1.00 (the untrained verifier said CONTINUE to all). A
    # whole-suite run of the same code: 60 steps, STOP 1.00, CONTINUE after a failed call 1.00,
    # after the wrong tool 1.00 -> 0.60; another, 80 steps: the same but 1.00 -> 0.50 (one
    # question kind's wrong tool judged STOP on all 20: the verdict read the kind, not the
    # result). With each failed call drawn from its rollout's seed (not a shared stream), seed 0
    # twice (2026-12-08, beside an eval): 80 steps each, the same held-out figures (STOP 0.00 ->
    # 1.00, CONTINUE after a failed call 1.00, after the wrong tool 1.00 -> 0.50); the per-step
    # curves agreed on steps 2-4, then differed by up to 0.10 in reward: a rerun repeats the
    # outcome, not every step (a remaining source of variation is not yet found).
    # Every verdict kind, each bound beside chance: a random verdict is right half the time.
    # After the wrong tool the bound is chance itself: training stops showing that state once
    # the planner is right (0.50 to 1.00 measured), so what it keeps there is not taught; it
    # must not fall below a coin. A constant verdict gets one kind right and the others wrong,
    # so the bounds together hold only for a verifier that reads the result.
    assert after["found"] >= 0.6, f"STOP after a right result (chance 0.5): {report}"
    assert after["failed"] >= 0.8, f"CONTINUE after a failed call (chance 0.5): {report}"
    assert after["wrong tool"] >= 0.5, f"CONTINUE after the wrong tool (chance 0.5): {report}"
