"""It learns: Flow-GRPO through the real flow takes a tiny planner from chance to the right tool.

The task (`learning.task`): arithmetic questions need `python`, capital questions need
`local_search` over a 20-passage corpus; the fixed engine is scripted and deterministic, so
only the planner's tool choices decide the reward. A rollout has up to two turns: the verifier
says CONTINUE while the last tool result lacks what the question needs, so the wrong tool
first gets a second turn, and the answer (from the last result) is right only if the right
tool was used within the budget. The reward is the outcome, less 0.25 for a second turn
(`learning.task.turn_cost`), broadcast to every turn. The planner is a small Qwen2 warmed up
on the output format with random tools and sub-goals of 0 to 5 filler words, so it starts at
chance and its completions vary in length.

Held out: 40 distinct questions that training never saw (`learning.task.held_out_cases`): 20
sums of numbers from 60 to 99 with different totals (training adds 2 to 59) and the capitals of
20 countries in no training question, each asked once (their passages are in the corpus, the
first ones listed by training's searches, and every country's name is one token, as in a
pretrained tokenizer). Measured greedy under the training's prompt (two turns): the share whose
first tool is the right one (chance 0.5) and the success; success at one turn is printed.

It trains for at most 60 steps and stops once, for three steps, the training reward has stayed
at 0.95 or more and the rollouts averaged at most 1.12 turns. Every sampled call is seeded from
`SEED` (a failure prints it; `FLOWLEARN_TEST_SEED` reruns with another). Runs 1-8 and the CI
runs below were unseeded. What it took:
- The first version's settings carried over unchanged (`learning.warmup`; balanced steps of 16
  questions x 8 rollouts, KL beta 0.04, Adam epsilon 1e-5, 5 warm-up steps of the learning
  rate): see that record below. Added: two turns, filler words (budget 32 new tokens), an
  engine that answers from the last tool result only, and a stop rule on turns as well as on
  reward, since with a second turn the reward reaches 0.95 while the first choice is still
  wrong in about one rollout in five (chance first gives 0.75: two tries at one half).
- At the start about half the rollouts take two turns (mean turns 1.5), completions run
  from 2 to 32 tokens (mostly 5 to 16), and the reward sits near 0.75 (as chance predicts).
- Run 1 (stop rule over five steps, on a CPU shared with another job): reward flat at about
  0.75 for 20 steps, then rising from step 20 to 0.95 at step 25; mean turns from 1.5 to 1.05
  at step 29; stopped at step 38; held-out success 0.50 -> 1.00 (one turn) and 0.50 -> 1.00
  (two turns); 4864 rollouts, 3162 of one turn and 1702 of two. 8.6 minutes in all (7.6 of
  training, 9 s a step), so the stop rule was shortened to three steps.
- Runs 2 and 3 (this version; CPU still shared): stopped at steps 25 and 22, 5.6 and 3.9
  minutes in all; reward near 0.75 for 9 steps, a dip at step 10 or 11 (0.38, 0.17: format
  errors for one step, then recovered), 0.95 by steps 17 and 16; mean turns 1.5 -> 1.06 and
  1.02; held-out success 0.50 -> 1.00 (one turn) in both. 3227 and 2816 rollouts: 1973 / 1227
  and 1822 / 994 of one / two turns. Completion lengths from 2 to 32, but they shorten as it
  learns: about 60% of the planner turns end up with no filler (5 tokens) and some 5% run to
  the 32-token cut.
- Run 4 (the same): stopped at step 23, 4.4 minutes in all; no dip; reward 0.96 by step 12;
  mean turns 1.5 -> 1.02; held-out success 0.50 -> 1.00 (one turn). 2944 rollouts: 2068 of
  one turn, 876 of two.
- A CI run (session 11's code) learned to sample two or three fillers before the tool name
  and trained to reward 1.0 in 46 steps, but held-out success fell 0.50 -> 0.00 at one and two
  turns: greedy filler did not end as sampled filler does. The tool name now comes first
  (`learning.warmup.FORMAT`), and the held-out outcomes (tools, format errors) are printed.
  Run 5 (that format, after a prefilled `Justification:` and a justification line): stopped at
  step 18, 2.8 minutes in all; held-out 0.50 -> 1.00 (one and two turns); completions of 2 to
  20 tokens. Since then the product's prompt puts the tool name first and prefills it, so the
  toy writes the tool straight after the prefill.
- Runs 1-4 asserted success at one turn, and printed it at two: 0.50 -> 1.00, 1.00, 0.80,
  1.00. The one-turn measure renders "step 1 of at most 1", a prompt training never showed.
  Run 6 (tool name prefilled, session 12) is why the measure moved to the training's prompt:
  stopped at step 31, held-out success at two turns 0.50 -> 1.00 with every first tool right,
  but at one turn 0.50 -> 0.50 (python for every question under the unseen prompt). The
  product's prompt then stopped naming the budget ("This is step 1."), so both measures read
  the same first prompt. Run 7 (that prompt): stopped at step 44, 7 minutes in all; reward
  near 0.7 for 25 steps, 0.97 by step 33; held-out 0.50 -> 1.00 at one and two turns, every
  first tool right.
- A CI run (session 12's code) found a second optimum of the outcome alone: `local_search`
  first for every question, then `python` when the search had no sum. Reward 1.0 by step 36,
  mean turns still 1.5, held-out at two turns 0.50 -> 1.00 but every first tool
  `local_search`; 60 steps, no stop. A second turn now costs 0.25 (`learning.task.turn_cost`),
  so only the right tool first earns the most (chance now gives about 0.62). Run 8: reward
  near 0.6 for 17 steps, 0.94 at step 21, stopped at step 24 (2.8 minutes in all); mean turns
  1.5 -> 1.06; held-out 0.50 -> 1.00 at one and two turns, every first tool right. A
  clean-clone CI run of session 13's code then passed it in 110 s.
- Two clean-clone CI runs of four (2026-12-06) stopped on the training reward with 13 of 20
  held-out capitals sent to python first (right first tool 0.68); with 30 training countries
  the same. The tokenizer was fitted on training prompts alone: every training country was one
  token, each unseen one was split into letters (`K en y a`), as a sum's digits are, so
  "short pieces -> python" fitted training as well as "capital -> local_search". Now every
  country's name is one token (`CAPITALS` among the tokenizer's texts) and the held-out
  countries' passages come first in the corpus, so searches in training list them after the
  match (as in `test_roles_learn`). Five runs: stopped at steps 25, 28, 33, 24 and 32 (about
  3 minutes each); held-out 0.50 -> 1.00 at one and two turns, every first tool right, in each.
- The held-out set then asked 25 distinct questions (the capitals of 5 countries, Portugal 8
  times), so 0.9 passed with 2 of 5 countries wrong. Now 20 countries, each once, and 20 sums
  (2026-12-07, seed 0, beside other jobs): stopped at step 48 (8 minutes); reward near 0.6 for
  30 steps, a dip at steps 36-38 (0.50, 0.44, 0.42), 0.95 by step 46; held-out 0.50 -> 1.00 at
  one and two turns, every first tool right (all 20 countries to `local_search`).

The first version (one turn, near-constant lengths, held-out capitals of training countries)
learned in 13 to 22 steps with 8 rollouts per question; with 4, 2 runs of 6 collapsed to one
tool (every group without variance) before the question types separated, and without balanced
steps one run in CI did. Without the KL the output format broke in some runs (every reward 0).
Weights drawn with std 0.1 and the deciding words kept as tokens (`learning.warmup`) let the
question types separate at all; a warm-up that leaves the choice free starts the planner on one
tool for every question, with no variance to learn from.
"""

from __future__ import annotations

import os
import random
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("trl")

from transformers import AutoModelForCausalLM, TrainerCallback
from trl.trainer.grpo_config import GRPOConfig

from flowlearn.engine.local import HFPolicy
from flowlearn.engine.sampling import Generation, Messages, Sampling
from flowlearn.evals.benchmarks import score_case
from flowlearn.evals.cases import Case
from flowlearn.evals.harness import run_eval
from flowlearn.evals.scorers import Score
from flowlearn.graphs import Context
from flowlearn.graphs import build_agentflow as _build_agentflow
from flowlearn.nodes.smollm2 import SMOLLM2_PROMPTS
from flowlearn.nodes.tools import local_search_tool, python_tool
from flowlearn.training.trainer import FlowGRPOTrainer
from learning.task import (
    ALL_CAPITALS,
    HELD_OUT_COUNTRIES,
    TRAIN_COUNTRIES,
    held_out_cases,
    make_cases,
    scripted_engine,
    turn_cost,
    write_corpus,
)
from learning.warmup import FORMAT, TOOLS, WORDS, build_policy, planner_output, warm_up_format

pytestmark = pytest.mark.slow  # minutes of training on 2 CPU cores

PROMPTS = SMOLLM2_PROMPTS
"""The toy learns under the tool-name-first, prefilled planner prompt (see the docstring's CI
run: sampled filler before a tool name did not end greedily), which is this preset's."""
SEED = int(os.environ.get("FLOWLEARN_TEST_SEED", "0"))
"""Seeds the tokenizer's texts, the model's weights, the warm-up and every sampled planner call
of the rollouts (the trainer's context carries it; each call derives its own from it, the step,
the rollout, the question and the turn). A failure prints it; `FLOWLEARN_TEST_SEED=N` reruns."""
STEPS = 60
MAX_TURNS = 2
MAX_NEW_TOKENS = 32
KEPT_WORDS = [*WORDS, *"0123456789"]
"""Digits kept whole, as the roles test keeps them: held-out sums add numbers training never
showed, so their digits must be tokens training has seen (a CI run with merged number tokens
sent every held-out sum to `local_search` first while its training reward reached 0.97)."""


def build_agentflow(policy: Any, engine: Any, tools: Any) -> Any:
    return _build_agentflow(policy, engine, tools, prompts=PROMPTS)


class PromptRecorder:
    """A policy that picks random tools and records the planner prompts the real flow renders
    (first and second turns)."""

    continues_prefill = True  # as the HF policy it stands in for: prompts end in the prefill

    def __init__(self) -> None:
        self.prompts: list[Messages] = []
        self.rng = random.Random(SEED)

    def generate(self, messages: Messages, sampling: Sampling) -> Generation:
        self.prompts.append(messages)
        return Generation(text=planner_output(self.rng.choice(TOOLS), self.rng))


class RolloutShapes:
    """A rollout store that keeps only each rollout's planner turns and completion lengths."""

    def __init__(self) -> None:
        self.turns: Counter[int] = Counter()
        self.lengths: Counter[int] = Counter()

    def __iter__(self) -> Iterator[Any]:  # nothing stored to reuse
        return iter(())

    def append(self, trajectory: Any) -> None:
        planner = [
            t
            for t in trajectory.transitions
            if t.get("node") == "planner" and t.get("completion_ids") is not None
        ]
        self.turns[len(planner)] += 1
        self.lengths.update(len(t["completion_ids"]) for t in planner)


class StopWhenLearned(TrainerCallback):
    """Stop once, for three steps, the training reward stayed at 0.95 or more and the rollouts
    averaged at most 1.12 turns (the right tool first in about 90% of them)."""

    def __init__(self) -> None:
        self.rewards: list[float] = []
        self.turns: list[float] = []

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
        if logs and "flow/mean_reward" in logs:
            self.rewards.append(float(logs["flow/mean_reward"]))
            self.turns.append(float(logs["flow/mean_turns"]))
        if (
            len(self.rewards) >= 5
            and min(self.rewards[-3:]) >= 0.95
            and max(self.turns[-3:]) <= 1.12
        ):
            control.should_training_stop = True


def scorer(answer: str, case: Case) -> Score:
    return score_case("exact_match", answer, case)


def held_out_success(
    model: Any, tokenizer: Any, engine: Any, tools: Any, cases: list[Case], max_turns: int = 1
) -> tuple[float, float]:
    """Greedy success of the model as planner on `cases`, and the share whose first tool was
    the right one."""
    flow = build_agentflow(HFPolicy(model, tokenizer), engine, tools)
    greedy = Context(
        max_turns=max_turns, planner_temperature=0.0, planner_max_new_tokens=MAX_NEW_TOKENS
    )
    results = run_eval(flow, cases, scorer, concurrency=1, progress=False, context=greedy)
    outcomes = Counter((tuple(r.tools), r.format_errors, r.score) for r in results)
    print(f"held-out at {max_turns} turn(s): (tools, format errors, score) {dict(outcomes)}")
    first = [r.tools[:1] == ["python" if "+" in r.query else "local_search"] for r in results]
    return sum(r.score for r in results) / len(results), sum(first) / len(results)


@pytest.mark.parametrize("max_staleness", [0, 1], ids=["synchronous", "one-step-off-policy"])
def test_flow_grpo_raises_held_out_success_from_chance(tmp_path: Path, max_staleness: int) -> None:
    engine = scripted_engine()
    # The held-out countries' passages come first, so searches list them after the match: their
    # names are in prompts training saw, though in no training question.
    corpus = write_corpus(tmp_path / "corpus.jsonl", first=HELD_OUT_COUNTRIES)
    tools = [python_tool(), local_search_tool(corpus)]
    train_cases = make_cases(64, 0, shuffle=False)
    held_out = held_out_cases()
    assert len({c.query for c in held_out}) == 40  # 20 sums and 20 countries, each once
    assert not {c.query for c in train_cases} & {c.query for c in held_out}
    assert not any(country in c.query for c in train_cases for country in HELD_OUT_COUNTRIES)
    assert all(
        any(country in c.query for country in TRAIN_COUNTRIES) or "+" in c.query
        for c in train_cases
    )
    recorder = PromptRecorder()
    recording = build_agentflow(recorder, engine, tools)
    for case in train_cases:
        recording.invoke({"question": case.query}, context=Context(max_turns=MAX_TURNS))
    texts = [m["content"] for messages in recorder.prompts for m in messages]
    texts += ["Tool Name:" + FORMAT.format(filler="", tool=t) for t in TOOLS] * 20
    texts += list(ALL_CAPITALS)  # every country's name one token, as a pretrained tokenizer has it
    model, tokenizer = build_policy(tmp_path / "policy", texts, SEED, words=KEPT_WORDS)
    warm_up_format(model, tokenizer, recorder.prompts, seed=SEED)
    # Saved and reloaded, so the trained model starts from the warmed-up weights on disk.
    model.save_pretrained(tmp_path / "warm")
    tokenizer.save_pretrained(tmp_path / "warm")
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "warm")

    before, _ = held_out_success(model, tokenizer, engine, tools, held_out)
    before_2, first_before = held_out_success(model, tokenizer, engine, tools, held_out, MAX_TURNS)
    assert 0.3 <= first_before <= 0.7, (
        f"seed {SEED}: the warmed-up planner should start near chance: {first_before}"
    )

    args = GRPOConfig(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=16 * 8,
        num_generations=8,
        steps_per_generation=1,
        gradient_accumulation_steps=1,
        max_steps=STEPS,
        learning_rate=5e-3,
        lr_scheduler_type="constant_with_warmup",
        warmup_steps=5,
        adam_epsilon=1e-5,
        temperature=1.0,
        loss_type="dapo",
        beta=0.04,  # KL to the warmed-up policy: keeps the format while the choice moves
        max_completion_length=MAX_NEW_TOKENS,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        gradient_checkpointing=False,
        use_cpu=True,
        bf16=False,
        seed=SEED,
        shuffle_dataset=False,  # alternating cases: every step takes 8 of each type
    )
    args.max_staleness = max_staleness  # type: ignore[attr-defined]  # FlowGRPOConfig's
    shapes = RolloutShapes()
    trainer = FlowGRPOTrainer.online(
        model,
        args=args,
        engine=engine,
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
        extra_rewards={"turns": turn_cost()},
        callbacks=[StopWhenLearned()],
        rollout_store=shapes,
    )
    trainer.train()

    after, _ = held_out_success(model, tokenizer, engine, tools, held_out)
    after_2, first_after = held_out_success(model, tokenizer, engine, tools, held_out, MAX_TURNS)
    logs = [h for h in trainer.state.log_history if "flow/mean_reward" in h]
    curve = [round(h["flow/mean_reward"], 3) for h in logs]
    turns = [round(h["flow/mean_turns"], 3) for h in logs]
    report = (
        f"seed {SEED}, max_staleness {max_staleness} (rerun: FLOWLEARN_TEST_SEED={SEED} "
        f"pytest {__file__}); "
        f"held-out success (1 turn) {before:.2f} -> {after:.2f}, (2 turns) {before_2:.2f} -> "
        f"{after_2:.2f}; right first tool (2 turns) {first_before:.2f} -> {first_after:.2f}; "
        f"{len(curve)} steps; reward curve {curve}; mean turns {turns}; "
        f"rollout turns {dict(shapes.turns)}; completion lengths {sorted(shapes.lengths.items())}"
    )
    print(report)
    rollouts = sum(shapes.turns.values())
    assert shapes.turns[1] >= 0.05 * rollouts and shapes.turns[2] >= 0.05 * rollouts, report
    assert len(shapes.lengths) >= 4, report  # completions of varied lengths
    # Each bound beside the chance it beats: a random first tool is right half the time, and
    # succeeds at two turns three times in four (the second try repairs half the misses).
    assert first_after >= 0.9, f"right first tool {first_after:.2f} (chance 0.5): {report}"
    assert after_2 >= 0.9, f"success at two turns {after_2:.2f} (chance 0.75): {report}"
    # the right tool first: mean turns fall from about 1.5 (chance) by more than 0.2
    assert sum(turns[:5]) / 5 > sum(turns[-5:]) / 5 + 0.2, report
    # the training reward rose (chance, with the second turn's cost, about 0.62)
    assert sum(curve[-5:]) / 5 > sum(curve[:5]) / 5 + 0.1, report
