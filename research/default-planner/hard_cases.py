"""Training questions the shipped planner gets wrong: a fresh pool, probed, its hardest kept.

The shipped planner sends a held-out lookup to python when the untrained engine's query
analysis talks of Python (5 of the 6 such lookups at greedy decoding in session 22, against 1 of
the 18 others), and every run so far moved the tool name's shared bias more than its dependence
on the question (`research/default-planner/results/learn_tools_runs.txt`). A round whose groups all
answer right
carries no gradient, so this builds rounds from questions the shipped planner is unsure of:

1. a fresh pool of both kinds, in the task's phrasings (`flowlearn.evals.tool_task`) and in the
   diverse split's (`flowlearn.evals.tool_task_diverse`, which no evaluation set uses), new
   names and numbers from `--seed`;
2. each question's first planner prompt as the flow renders it (with `--query-analysis`, as a
   run with `Context.query_analysis` on: the untrained engine's greedy analysis, cached in
   `--cache`), and the shipped planner's probability of the right
   tool's first token at T=0.7 (`research/default-planner/tool_choice.py`);
3. the `--per-kind` questions of each kind with the lowest probability, in rounds of a lookup
   and an arithmetic question (hardest first), written with the task corpus plus the pool's
   passages to `--out` (`train.jsonl`, `corpus.jsonl`, `probe.jsonl` with every pool question's
   probability).

    python research/default-planner/hard_cases.py --out runs/hard
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
from pathlib import Path
from typing import Any

import torch

from flowlearn.engine.loading import SHIPPED_ADAPTER
from flowlearn.evals.tool_task import CORPUS_FILE, arithmetic_cases, lookup_cases
from flowlearn.evals.tool_task_diverse import ANSWERED_FIRST, FACTS, new_cases, used_names

HERE = Path(__file__).resolve().parent


def pool(lookups: int, arithmetic: int, pairs: int, seed: int) -> tuple[list[dict], list[dict]]:
    """Fresh cases in the task's phrasings and in the diverse split's, and their passages.

    The diverse split's lookups keep only the relations the untrained engine answers given the
    passage (`ANSWERED_FIRST[:5]`): a lookup it garbles rewards no search (run 13).
    """
    used = used_names()
    rng = random.Random(seed)
    facts, passages = lookup_cases(lookups, rng, "hard", used)
    cases = arithmetic_cases(arithmetic, rng, "hard") + facts
    # `used` now holds the task corpus's names and the ones just drawn: no name twice (run 16's
    # pool, drawn before this, had "Mount Lusaex" and "Lusaex Dam")
    new, new_passages = new_cases(pairs, seed=seed, used=used)
    for i, passage in enumerate(new_passages):  # pair i: new[2i] its lookup, new[2i+1] arithmetic
        lookup, math = ({**c, "id": "hard-" + c["id"]} for c in new[2 * i : 2 * i + 2])
        cases.append(math)
        if i % len(FACTS) in ANSWERED_FIRST[:5]:
            cases.append(lookup)
            passages.append(passage)
    return cases, passages


def probe(
    cases: list[dict[str, Any]], cache: Path, corpus: Path, *, query_analysis: bool = False
) -> list[float]:
    """The shipped planner's p(right tool's first token) at T=0.7 on each case's first prompt."""
    sys.path.insert(0, str(HERE))
    import tool_choice
    from peft import PeftModel

    prompts, model, tokenizer = tool_choice.first_prompts(
        cases, cache, corpus, query_analysis=query_analysis
    )
    firsts = tool_choice.first_tokens(tokenizer, prompts[0], ["local_search", "python"])
    shipped = PeftModel.from_pretrained(model, SHIPPED_ADAPTER).eval()
    logits = tool_choice.next_token_logits(shipped, prompts)
    return [
        float(torch.softmax(lg / 0.7, -1)[firsts[case["tool"]]])
        for case, lg in zip(cases, logits, strict=True)
    ]


def hardest(cases: list[dict[str, Any]], p: list[float], per_kind: int) -> list[dict[str, Any]]:
    """The `per_kind` lowest-p cases of each kind, in rounds of (lookup, arithmetic)."""
    ranked = sorted(zip(p, range(len(cases)), cases, strict=True))
    by_kind = {k: [c for _, _, c in ranked if c["kind"] == k] for k in ("lookup", "arithmetic")}
    for kind, kept in by_kind.items():
        if len(kept) < per_kind:
            raise SystemExit(
                f"the pool holds {len(kept)} eligible {kind} cases, fewer than --per-kind "
                f"{per_kind}: lower --per-kind, draw a bigger pool (--lookups, --arithmetic, "
                "--pairs) or keep more (--lookup-forms all, a narrower --exclude)"
            )
    pairs = zip(by_kind["lookup"][:per_kind], by_kind["arithmetic"][:per_kind], strict=True)
    return [case for pair in pairs for case in pair]


def eligible(case: dict[str, Any], lookup_forms: str, exclude: str | None) -> bool:
    """Whether a pool case may be kept: `--lookup-forms task` keeps the task's lookups only
    (run 16a: the untrained engine answered none of the diverse lookups it searched for, its
    queries missing the entity's name), `--exclude` drops questions matching a regex (run 16a:
    the executor wrote "1024 * 771" for "If each of 630 boxes holds 771 items ...")."""
    if case["kind"] == "lookup" and lookup_forms == "task" and "diverse" in case["id"]:
        return False
    return exclude is None or re.search(exclude, case["question"]) is None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/hard"))
    parser.add_argument("--lookups", type=int, default=30, help="lookups in the task's forms")
    parser.add_argument("--arithmetic", type=int, default=16, help="arithmetic, task's forms")
    parser.add_argument("--pairs", type=int, default=32, help="diverse pairs (lookups filtered)")
    parser.add_argument("--per-kind", type=int, default=8, help="hardest kept of each kind")
    parser.add_argument("--seed", type=int, default=23)
    parser.add_argument("--lookup-forms", choices=("all", "task"), default="all")
    parser.add_argument("--exclude", default=None, help="drop questions matching this regex")
    parser.add_argument("--reuse-probe", action="store_true", help="read --out/probe.jsonl")
    parser.add_argument("--name", default="train.jsonl", help="the rounds' file name in --out")
    parser.add_argument("--cache", type=Path, default=Path("runs/tool-choice-analyses-hard.json"))
    parser.add_argument("--query-analysis", action="store_true", help="prompts with the analysis")
    args = parser.parse_args(argv)
    if min(args.per_kind, args.lookups, args.arithmetic, args.pairs) < 1:
        parser.error("--per-kind, --lookups, --arithmetic and --pairs must be at least 1")
    try:
        re.compile(args.exclude or "")
    except re.error as exc:
        parser.error(f"--exclude {args.exclude!r} is not a regular expression: {exc}")
    cases, passages = pool(args.lookups, args.arithmetic, args.pairs, args.seed)
    if args.reuse_probe:  # checked before anything in --out is rewritten
        if not (args.out / "probe.jsonl").is_file():
            raise SystemExit(f"--reuse-probe: no {args.out}/probe.jsonl; run without it first")
        probed = [json.loads(line) for line in (args.out / "probe.jsonl").read_text().splitlines()]
        if [(c["id"], c["question"]) for c in probed] != [(c["id"], c["question"]) for c in cases]:
            raise SystemExit(
                f"--reuse-probe: {args.out}/probe.jsonl probed another pool (other --seed or "
                "sizes); run without --reuse-probe to probe this one"
            )
        p = [c["p_right"] for c in probed]
    args.out.mkdir(parents=True, exist_ok=True)
    corpus = args.out / "corpus.jsonl"
    lines = CORPUS_FILE.read_text().splitlines() + [json.dumps(p) for p in passages]
    corpus.write_text("".join(line + "\n" for line in lines))
    if not args.reuse_probe:
        p = probe(cases, args.cache, corpus, query_analysis=args.query_analysis)
        probed = [{**case, "p_right": round(q, 4)} for case, q in zip(cases, p, strict=True)]
        (args.out / "probe.jsonl").write_text("".join(json.dumps(c) + "\n" for c in probed))
    keep = [eligible(c, args.lookup_forms, args.exclude) for c in cases]
    cases, p = (
        [c for c, k in zip(cases, keep, strict=True) if k],
        [q for q, k in zip(p, keep, strict=True) if k],
    )
    chosen = hardest(cases, p, args.per_kind)
    (args.out / args.name).write_text("".join(json.dumps(c) + "\n" for c in chosen))
    for kind in ("lookup", "arithmetic"):
        ps = sorted(q for case, q in zip(cases, p, strict=True) if case["kind"] == kind)
        kept = ps[: args.per_kind]
        print(
            f"{kind}: {len(ps)} eligible, mean p {sum(ps) / len(ps):.2f}, "
            f"p < 0.5 for {sum(q < 0.5 for q in ps)}; kept p {kept[0]:.2f} to {kept[-1]:.2f}"
        )
    print(f"wrote {args.out}/{args.name} ({len(chosen)} cases), corpus.jsonl, probe.jsonl")


if __name__ == "__main__":
    main()
