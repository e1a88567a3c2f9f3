"""How surely a planner picks the right tool on its first turn: base against trained adapters.

A held-out eval runs the whole flow (about 10 minutes for 48 questions on 2 cores); the tool
choice is decided by the planner's first written token (the tool name comes first, after the
prefilled "Tool Name:"). This renders each question's first planner prompt exactly as the flow
does (the default tools, `plan_messages`; with `--query-analysis`, the untrained engine's greedy
analysis, as a run with `Context.query_analysis` on shows it), then
reads the next-token distribution of the untrained planner and of each adapter given:
- `greedy right`: questions whose most likely next token starts the right tool's name (what a
  greedy eval would choose, format errors aside);
- `p(right)`: the mean probability, at the sampling temperature, of the right tool's first
  token (what a sampled eval, `--temperature 0.7`, would choose on average);
- `p(other tool)`: the same for the other tools; the rest of the mass is format errors.
A checkpoint is picked on training questions the run did not use (the default `--cases`);
the held-out set is kept for the final eval.

`--layout question-last` renders the prompt with the question repeated before the reply format,
`--layout no-examples` without the worked plans (untrained only: an adapter learned the shipped
layout). Results:
`research/default-planner/results/tool_choice_*`.

Run: `python research/default-planner/tool_choice.py runs/learn-tools/checkpoint-{8,12,16} [--cases
FILE --skip N]`
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from flowlearn.compose import FlowSpec, build_tools, load_parts
from flowlearn.engine.local import chat_prompt_ids
from flowlearn.evals.cases import with_answer_instruction
from flowlearn.evals.tool_task import CORPUS_FILE, TRAIN_FILE
from flowlearn.nodes import planner as planner_module
from flowlearn.nodes.catalogue import render_catalogue
from flowlearn.nodes.engine_calls import role_call
from flowlearn.nodes.prompts import Prompts
from flowlearn.nodes.schema.context import Context
from flowlearn.nodes.smollm2 import SMOLLM2_PROMPTS

PLANNER_PROMPT = SMOLLM2_PROMPTS.planner
"""The shipped planner's prompt: the smollm2 preset's, which the adapters were trained with."""

LAYOUTS = {
    "shipped": PLANNER_PROMPT,
    # the question once more just before the reply format, where the tool is chosen
    "question-last": PLANNER_PROMPT.replace(
        "This is step {turn}.\n", "This is step {turn}.\n\nQuestion: {question}\n"
    ),
    # without the worked plans (one per tool, python's last)
    "no-examples": PLANNER_PROMPT.replace("{examples}", ""),
}
"""Planner-prompt layouts to compare the untrained planner's choice under (`--layout`)."""


def pick_cases(path: Path, skip: int, per_kind: int) -> list[dict[str, Any]]:
    """The first `per_kind` cases of each kind after the first `skip` lines of `path`."""
    cases = [json.loads(line) for line in path.read_text().splitlines()][skip:]
    chosen: list[dict[str, Any]] = []
    for kind in ("lookup", "arithmetic"):
        chosen += [c for c in cases if c["kind"] == kind][:per_kind]
    return chosen


def first_prompts(
    cases: list[dict[str, Any]],
    cache: Path,
    corpus: Path = CORPUS_FILE,
    *,
    query_analysis: bool = False,
    prompts: Prompts = SMOLLM2_PROMPTS,
) -> tuple[list[list[int]], Any, Any]:
    """Each case's first planner prompt ids (analyses cached in `cache`); the model, tokenizer."""
    spec = FlowSpec.from_env(planner="default-base", corpus=str(corpus), batch_size=16)
    planner, engine = load_parts(spec, prompts)
    tools = build_tools(spec, engine, prompts)
    catalogue = render_catalogue(tools)
    questions = [with_answer_instruction(c["question"]) for c in cases]
    analyses = analyse(questions, tools, engine, cache, prompts) if query_analysis else {}
    handle: Any = planner.handle  # type: ignore[attr-defined]
    tokenizer = handle.tokenizer
    ids = [
        chat_prompt_ids(
            tokenizer,
            planner_module.plan_messages(
                {"question": q},  # type: ignore[typeddict-item]
                Context(max_turns=1),
                tools,
                analysis=analyses.get(q),
                tools=catalogue,
                turn=1,
                prefill=True,
                prompts=prompts,
            ),
        )
        for q in questions
    ]
    return ids, handle.model, tokenizer


def analyse(
    questions: list[str], tools: Any, engine: Any, cache: Path, prompts: Prompts = SMOLLM2_PROMPTS
) -> dict[str, str]:
    """The untrained engine's greedy query analysis of each question, cached in `cache`."""
    # keyed by the analysis prompt's text: a changed prompt is analysed afresh
    asked = {q: planner_module.analysis_messages(q, tools, prompts) for q in questions}
    keys = {q: json.dumps(messages) for q, messages in asked.items()}
    known = json.loads(cache.read_text()) if cache.is_file() else {}
    missing = [q for q in questions if keys[q] not in known]
    if missing:
        ask = role_call(engine, None, max_tokens=prompts.budgets.query_analysis)
        with ThreadPoolExecutor(16) as pool:
            replies = pool.map(lambda q: ask(asked[q]).text, missing)
            known.update({keys[q]: text for q, text in zip(missing, replies, strict=True)})
        cache.parent.mkdir(parents=True, exist_ok=True)
        cache.write_text(json.dumps(known, indent=1))
    return {q: known[keys[q]] for q in questions}


def first_tokens(tokenizer: Any, prompt: list[int], names: list[str]) -> dict[str, int]:
    """The token each tool name starts with when the model writes it after the prompt."""
    text = tokenizer.decode(prompt)
    out = {}
    for name in names:
        ids = tokenizer(text + " " + name, add_special_tokens=False)["input_ids"]
        if ids[: len(prompt)] != prompt:
            raise ValueError(f"the prompt does not re-encode to itself before {name!r}")
        out[name] = int(ids[len(prompt)])
    return out


@torch.no_grad()
def next_token_logits(model: Any, prompts: list[list[int]]) -> list[torch.Tensor]:
    """The logits of the token after each prompt (one prompt a pass: no padding effects)."""
    return [model(torch.tensor([p])).logits[0, -1].float() for p in prompts]


def report(
    name: str,
    cases: list[dict[str, Any]],
    logits: list[torch.Tensor],
    firsts: dict[str, int],
    t: float,
) -> dict[str, Any]:
    """Per kind: greedy right, mean p(right) and p(other tools) at temperature t."""
    out: dict[str, Any] = {"model": name}
    for kind in ("lookup", "arithmetic"):
        rows = [(c, lg) for c, lg in zip(cases, logits, strict=True) if c["kind"] == kind]
        greedy = sum(int(lg.argmax()) == firsts[c["tool"]] for c, lg in rows)
        p_right = sum(float(torch.softmax(lg / t, -1)[firsts[c["tool"]]]) for c, lg in rows)
        p_tools = sum(
            float(torch.softmax(lg / t, -1)[list(firsts.values())].sum()) for _, lg in rows
        )
        n = len(rows)
        out[kind] = {
            "n": n,
            "greedy_right": greedy,
            "p_right": p_right / n,
            "p_other_tool": (p_tools - p_right) / n,
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("adapters", nargs="*", type=Path, help="checkpoint folders of a run")
    parser.add_argument("--cases", type=Path, default=TRAIN_FILE)
    parser.add_argument(
        "--skip",
        type=int,
        default=16,
        help="lines of --cases the run trained on: the recipe's 2 a round, a round every 2 "
        "steps (16: its 16 steps; run 11 trained on train_lookup_heavy.jsonl, 3 a round)",
    )
    parser.add_argument("--per-kind", type=int, default=20)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--cache", type=Path, default=Path("runs/tool-choice-analyses.json"))
    parser.add_argument("--out", type=Path, default=None, help="append JSON lines here")
    parser.add_argument("--layout", choices=sorted(LAYOUTS), default="shipped")
    parser.add_argument(
        "--query-analysis",
        action="store_true",
        help="show the untrained engine's query analysis (a run with Context.query_analysis on)",
    )
    args = parser.parse_args()
    if args.layout != "shipped" and args.adapters:
        parser.error("--layout compares the untrained planner only: adapters learned 'shipped'")
    layout = dataclasses.replace(SMOLLM2_PROMPTS, planner=LAYOUTS[args.layout])
    cases = pick_cases(args.cases, args.skip, args.per_kind)
    prompts, model, tokenizer = first_prompts(
        cases, args.cache, query_analysis=args.query_analysis, prompts=layout
    )
    names = ["local_search", "generalist", "python"]
    firsts = first_tokens(tokenizer, prompts[0], names)
    results = [
        report(
            f"base ({args.layout}{', query analysis' if args.query_analysis else ''})",
            cases,
            next_token_logits(model, prompts),
            firsts,
            args.temperature,
        )
    ]
    print(json.dumps(results[-1]), flush=True)
    from peft import PeftModel

    peft: Any = None
    for i, folder in enumerate(args.adapters):
        if peft is None:
            peft = PeftModel.from_pretrained(model, folder, adapter_name=f"a{i}")
        else:
            peft.load_adapter(folder, adapter_name=f"a{i}")
        peft.set_adapter(f"a{i}")
        peft.eval()
        results.append(
            report(str(folder), cases, next_token_logits(peft, prompts), firsts, args.temperature)
        )
        print(json.dumps(results[-1]), flush=True)
    if args.out is not None:
        with args.out.open("a") as f:
            f.writelines(json.dumps(r) + "\n" for r in results)


if __name__ == "__main__":
    main()
