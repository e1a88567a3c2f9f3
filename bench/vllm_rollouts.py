"""Rollout throughput on a vLLM server: N concurrent flows against raw generation of their prompts.

Run, with a server up (`vllm serve MODEL --logprobs-mode processed_logprobs`):

    python bench/vllm_rollouts.py --url http://127.0.0.1:8000/v1 --model MODEL --flows 32

1. Flows arm: N flows at once through the AgentFlow graph, the planner on the server
   (`ServerPolicy`: prompt token ids in, token ids and logprobs out, as training samples), the
   fixed engine and the tool scripted so they answer at once: the server serves only the
   planner, and what the flows lose against the server's limit is their own cost (turns that
   wait for each other, the graph, the HTTP round trips). The verifier always says CONTINUE,
   so every flow makes `--max-turns` planner calls. Every call's prompt ids and completion
   length are kept.
2. Raw arm: the same prompt ids sent straight to `/v1/completions`, all at once (up to
   `--raw-concurrency`), each asked for exactly as many tokens as its flow call produced
   (`min_tokens` = `max_tokens`, `ignore_eos`): the same work, at the server's pace.
3. Both arms run once untimed (a warm-up), then `--repeats` (3) times in alternating order; a
   raw run replays the calls of the newest flows run. Prints completion tokens per second of
   both arms and the median ratio flows / raw (1.0 is the limit) with the range of the pair
   ratios, and writes every repeat as JSON (`--out`) with the commit, command and machine.
   `--dry-run` prints the plan, contacting nothing. `--model` may name a loaded LoRA adapter,
   to measure the adapter training samples from.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

QUESTIONS = [
    "What is 17 * 23?",
    "What is the capital of France?",
    "What is 128 + 256?",
    "Who wrote Hamlet?",
]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True, help="the server's OpenAI base URL, .../v1")
    parser.add_argument("--model", required=True, help="the served model (or adapter) name")
    parser.add_argument("--tokenizer", help="the model's tokenizer, hub id or folder (--model)")
    parser.add_argument("--flows", type=int, default=16, help="flows in flight at once")
    parser.add_argument("--max-turns", type=int, default=3, help="planner turns per flow")
    parser.add_argument("--max-new-tokens", type=int, default=256, help="planner tokens a turn")
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--raw-concurrency", type=int, default=256, help="raw requests at once")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds a request may take")
    parser.add_argument("--repeats", type=int, default=3, help="timed pairs after a warm-up (3)")
    parser.add_argument("--out", type=Path, help="write the figures here as JSON")
    parser.add_argument("--dry-run", action="store_true", help="print the plan and stop")
    args = parser.parse_args(argv)
    if args.repeats < 3:
        parser.error("--repeats must be >= 3: a figure is the median of at least 3 pairs")
    for name in ("flows", "max_turns", "max_new_tokens", "raw_concurrency"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    if not args.url.startswith(("http://", "https://")):
        parser.error(f"--url must be http(s)://HOST:PORT/v1, got {args.url!r}")
    return args


def flows_arm(args: argparse.Namespace, tokenizer: Any) -> tuple[float, list[dict[str, Any]]]:
    """Run `--flows` flows at once with the planner on the server; return seconds and calls."""
    from langchain_core.tools import tool

    from flowlearn.engine.scripted import ScriptedChatModel
    from flowlearn.engine.server import ServerPolicy
    from flowlearn.evals.cases import Case
    from flowlearn.evals.scorers import Score
    from flowlearn.graphs import Context, build_agentflow
    from flowlearn.training.rollouts import collect

    @tool
    def calculator(expression: str) -> str:
        """Evaluate an arithmetic expression."""
        return "42"

    engine = ScriptedChatModel(
        text="Conclusion: CONTINUE\n<answer>42</answer>", default_args={"expression": "6 * 7"}
    )
    planner = ServerPolicy(
        args.url,
        args.model,
        tokenizer=tokenizer,
        api_key_env="OPENAI_API_KEY",
        timeout_s=args.timeout,
        version=args.model,
    )
    cases = [Case(f"q{i}", QUESTIONS[i % len(QUESTIONS)], None) for i in range(args.flows)]
    context = Context(  # with the analysis call, as the recorded figures were taken
        max_turns=args.max_turns,
        planner_temperature=args.temperature,
        planner_max_new_tokens=args.max_new_tokens,
        query_analysis=True,
    )
    started = time.perf_counter()
    trajectories = collect(
        build_agentflow(planner, engine, [calculator]),
        cases,
        lambda answer, case: Score(0.0, "bench"),
        group_size=1,
        concurrency=args.flows,
        context=context,
        progress=False,
    )
    seconds = time.perf_counter() - started
    planner.close()
    calls = [
        {"prompt": t["prompt_ids"], "tokens": len(t["completion_ids"])}
        for trajectory in trajectories
        for t in trajectory.transitions
        if t["node"] == "planner" and t.get("prompt_ids") and t.get("completion_ids")
    ]
    if not calls:
        raise SystemExit("no planner call returned token ids: is the server vLLM 0.10.2+?")
    return seconds, calls


def raw_arm(args: argparse.Namespace, calls: list[dict[str, Any]]) -> tuple[float, int]:
    """Send the flows' prompts straight to the server, all at once; return seconds and tokens."""
    import os

    import httpx

    key = os.environ.get("OPENAI_API_KEY")
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    client = httpx.Client(base_url=args.url.rstrip("/"), headers=headers, timeout=args.timeout)

    def complete(call: dict[str, Any]) -> int:
        body = {
            "model": args.model,
            "prompt": call["prompt"],
            "max_tokens": call["tokens"],
            "min_tokens": call["tokens"],
            "ignore_eos": True,
            "temperature": args.temperature,
            "top_p": 1.0,
            "logprobs": 1,
            "return_token_ids": True,
        }
        response = client.post("/completions", json=body)
        if response.status_code >= 400:
            raise SystemExit(f"raw request failed: HTTP {response.status_code}: {response.text}")
        data = response.json()
        usage = data.get("usage") or {}
        return int(usage.get("completion_tokens") or len(data["choices"][0].get("token_ids") or []))

    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=min(args.raw_concurrency, len(calls))) as pool:
        tokens = sum(pool.map(complete, calls))
    seconds = time.perf_counter() - started
    client.close()
    return seconds, tokens


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    plan = {
        "url": args.url,
        "model": args.model,
        "tokenizer": args.tokenizer or args.model,
        "flows": args.flows,
        "max_turns": args.max_turns,
        "max_new_tokens": args.max_new_tokens,
        "temperature": args.temperature,
        "raw_concurrency": args.raw_concurrency,
    }
    if args.dry_run:
        print(json.dumps({"plan": plan}, indent=1))
        return 0
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(plan["tokenizer"])
    sys.path.insert(0, str(Path(__file__).parent))
    from measure import alternate, figure_line, provenance, ratios, spread

    newest: dict[str, Any] = {}
    runs: list[dict[str, Any]] = []

    def flows() -> float:
        seconds, calls = flows_arm(args, tokenizer)
        newest["calls"] = calls
        tokens = sum(call["tokens"] for call in calls)
        runs.append({"arm": "flows", "seconds": seconds, "tokens": tokens, "calls": len(calls)})
        return tokens / seconds

    def raw() -> float:
        seconds, tokens = raw_arm(args, newest["calls"])
        runs.append({"arm": "raw", "seconds": seconds, "tokens": tokens})
        return tokens / seconds

    rates = alternate({"flows": flows, "raw": raw}, args.repeats)
    pairs = ratios(rates["flows"], rates["raw"])
    result = {
        **provenance("vllm_rollouts.py", argv),
        **plan,
        "repeats": args.repeats,
        "flow_tokens_per_s": spread(rates["flows"]),
        "raw_tokens_per_s": spread(rates["raw"]),
        "ratio": pairs,
        "runs": runs,  # the warm-up pair first
    }
    print(
        f"{args.flows} flows: {statistics.median(rates['flows']):.1f} planner tokens/s; raw "
        f"generation of the same prompts: {statistics.median(rates['raw']):.1f} tokens/s "
        "(medians; 1.0 is the server's limit)"
    )
    print(figure_line("flows_over_raw_tokens_per_second", pairs))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
