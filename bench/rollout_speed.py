"""Rollout speed: the flow's rollouts against TRL's own GRPOTrainer generation, side by side.

Run: `python bench/rollout_speed.py` (the embedded SmolLM2-135M untrained, `default-base`, on
CPU), `--tiny` (a tiny random Qwen2 on CPU: the model's compute is almost free, so the host's
cost shows, as on a GPU) or `--device cuda` (a random Qwen2.5-0.5B-shaped model in bf16, built
locally: no hub). Both arms get the same model weights, the same batch (questions x G), the
same completion budget and sampling (temperature 1, no top-p or top-k), and the same prompts:
TRL's are the planner's first-turn prompts exactly as the flow rendered them (their token ids,
decoded with their special tokens), under the AgentFlow prompt set (`AGENTFLOW_PROMPTS`).

1. The flow: Q x G rollouts of the AgentFlow graph at once, the planner batched by
   `BatchingPolicy` (capacity Q x G, as TRL's), a scripted engine and the `python` tool (both
   timed; instant and `print(1)`). Its tokens are the planner's, every turn; its seconds the
   rollouts' wall time; `DecodeStats` say where the worker's time went. Its warm-up batch's
   first planner prompts become TRL's prompts.
2. TRL: `GRPOTrainer._generate` (tokenize, `generate`, EOS mask) on those prompts, each G
   times; its tokens are the completions' ids up to and with the first EOS.
3. The update: one offline Flow-GRPO update on the flow's median repeat (`--no-update`: none).
Where the ratio comes from: the flow reads a prompt prefix shared by a group once, decodes
continuously, and runs up to `--turns` planner turns to TRL's one. Each source has an arm that
turns it off (`--arms`, default all); each arm's ratio over TRL and the flow's over it (what
the source gives) are reported, pair by pair. The flow's planner stops at the end of its tool
line (its stop strings), TRL's at EOS or the budget; every flow repeat draws with seed 0.

After an untimed warm-up of every arm, the arms run `--repeats` times (tiny 5, cpu and cuda 3),
taking turns (flow, TRL, the variants; the order reversed every other repeat; TRL on its own
copy of the weights), so that a busier stretch of the machine slows all arms rather than one.
Every figure is the median of the pair ratios with their min-max range; every repeat is kept.

Results (with the commit, command line and machine) go to
bench/results/rollout_speed_<machine>[_tiny].json and .txt, rewritten as each arm ends. Last line:
`flow_over_trl_tokens_per_second=<median> pairs=<n> range=<min>-<max>`.
"""

from __future__ import annotations

import argparse
import random
import re
import signal
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

import torch
from gpu_checks import QWEN25_05B, TINY, model, tokenizer
from measure import (
    MIN_REPEATS,
    RESULTS,
    Report,
    Timer,
    alternate,
    figure_line,
    headline,
    middle,
    on_own_thread,
    provenance,
    ratios,
    spread,
)

from flowlearn.engine.batching import BatchingPolicy
from flowlearn.engine.loading import load_model_and_tokenizer
from flowlearn.engine.local import HFPolicy
from flowlearn.engine.scripted import ScriptedChatModel
from flowlearn.evals.cases import Case
from flowlearn.evals.scorers import Score
from flowlearn.graphs import Context, build_agentflow
from flowlearn.nodes.prompts import AGENTFLOW_PROMPTS
from flowlearn.nodes.tools import python_tool
from flowlearn.training import collect

DEFAULTS = {  # questions, group, tokens, turns, repeats
    "cpu": (2, 8, 64, 2, 3),
    "tiny": (4, 8, 64, 2, 5),
    "cuda": (4, 8, 256, 2, 3),
}


def scripted_engine(timer: Timer) -> ScriptedChatModel:
    """The fixed engine, instant: it recognises the AgentFlow and the SmolLM2 wordings."""

    def respond(messages: list[Any], tools: list[dict[str, Any]]) -> Any:
        from langchain_core.messages import AIMessage

        began = time.perf_counter()
        try:
            if tools:
                call = {"name": tools[0]["name"], "args": {"code": "print(1)"}, "id": "1"}
                return AIMessage("", tool_calls=[call])
            prompt = str(messages[-1].content)
            if "Conclusion: CONTINUE" in prompt:  # the verifier, either prompt set
                return "The memory is not enough yet.\nConclusion: CONTINUE"
            if "<answer>" in prompt:  # the generator, either prompt set
                return "<answer>1</answer>"
            return "Analysis: arithmetic; the python tool computes it."  # the query analysis
        finally:
            timer.add(time.perf_counter() - began)

    return ScriptedChatModel(respond=respond)


def timed_python(timer: Timer) -> Any:
    """The `python` tool (unisolated: it only ever runs the engine's `print(1)`), timed."""
    from langchain_core.tools import StructuredTool

    inner = python_tool(isolation="none")

    def python(code: str) -> str:
        began = time.perf_counter()
        try:
            return str(inner.invoke({"code": code}))
        finally:
            timer.add(time.perf_counter() - began)

    return StructuredTool.from_function(
        python, name=inner.name, description=inner.description, args_schema=inner.args_schema
    )


def cases(count: int) -> list[Case]:
    rng = random.Random(0)
    return [
        Case(f"q{i}", f"What is {rng.randint(2, 99)} + {rng.randint(2, 99)}?", "0")
        for i in range(count)
    ]


def first_planner_prompts(trajectories: list[Any], tokenizer: Any) -> list[str]:
    """Each question's first planner prompt as the flow rendered it (its token ids, decoded
    with their special tokens): the prompts TRL's arm generates from."""
    first: dict[str, list[int]] = {}
    for trajectory in trajectories:
        turn = next((t for t in trajectory.transitions if t["node"] == "planner"), None)
        if turn is not None:
            first.setdefault(trajectory.group_id, turn["prompt_ids"])
    return [tokenizer.decode(ids) for ids in first.values()]


VARIANTS = {  # the flow's arms: what each turns off of the default flow
    "flow": {},
    "flow_no_prefix_sharing": {"min_shared_prefix": sys.maxsize},
    "flow_static_batch": {"continuous": False},
    "flow_one_turn": {"turns": 1},
}
WHAT = {
    "flow": "the flow as training runs it",
    "flow_no_prefix_sharing": "the flow reading every prompt whole (no group prefix read once)",
    "flow_static_batch": "the flow decoding static batches (no call joins a running batch)",
    "flow_one_turn": "the flow stopped after the planner's first turn (TRL's one generation)",
}


class FlowArm:
    """The flow's rollouts: Q x G flows at once with the planner batched, one timed batch a call."""

    def __init__(self, args: argparse.Namespace, policy: HFPolicy, variant: str = "flow") -> None:
        self.args, self.policy, self.runs, self.variant = args, policy, [], variant
        settings = dict(VARIANTS[variant])
        turns = settings.pop("turns", args.turns)
        self.batching = settings  # BatchingPolicy's fields for this arm
        self.rows = args.concurrency or args.questions * args.group
        self.context = Context(
            max_turns=turns,
            planner_temperature=1.0,
            planner_top_p=1.0,
            planner_max_new_tokens=args.tokens,
            query_analysis=True,
            max_seconds=None,
            seed=0,
        )

    def warm_up(self) -> list[str]:
        """One untimed batch (first forwards, imports, the graph's first-run work), as TRL's
        arm gets one. Returns each question's first planner prompt as the flow rendered it
        (its token ids, decoded with their special tokens): TRL's prompts."""
        _, trajectories = one_flow(
            self.args, self.policy, self.context, self.rows, self.batching, warm=True
        )
        return first_planner_prompts(trajectories, self.policy.tokenizer)

    def once(self) -> float:
        self.runs.append(one_flow(self.args, self.policy, self.context, self.rows, self.batching))
        return float(self.runs[-1][0]["completion_tokens_per_second"])

    def result(self) -> tuple[dict, list]:
        """The figures of the repeat with the median tokens/s (every repeat's tokens/s in
        `repeats`, in run order) and its trajectories."""
        figures, trajectories = middle(
            self.runs, key=lambda run: run[0]["completion_tokens_per_second"]
        )
        figures["repeats"] = [run[0]["completion_tokens_per_second"] for run in self.runs]
        return figures, trajectories


def one_flow(
    args: argparse.Namespace,
    policy: HFPolicy,
    context: Context,
    rows: int,
    batching: dict[str, Any],
    warm: bool = False,
) -> tuple[dict, list]:
    """One timed batch of Q x G rollouts on a fresh batcher (no progress bar when `warm`)."""
    batched = BatchingPolicy(policy, max_batch_size=rows, max_wait_s=args.max_wait, **batching)
    batched.stats.sync = args.device == "cuda"  # forwards timed whole (the picks sync anyway)
    engine_time, tool_time = Timer(), Timer()
    graph = build_agentflow(
        batched, scripted_engine(engine_time), [timed_python(tool_time)], prompts=args.prompts
    )
    began = time.perf_counter()
    trajectories = collect(
        graph,
        cases(args.questions),
        lambda answer, case: Score(float(random.random() < 0.5), "random reward"),
        group_size=args.group,
        concurrency=rows,
        context=context,
        progress=not warm,
    )
    wall = time.perf_counter() - began
    batched.close()
    planner = [t for r in trajectories for t in r.transitions if t["node"] == "planner"]
    tokens = sum(len(t.get("completion_ids") or []) for t in planner)
    stats = batched.stats
    worker = {
        "prefill": stats.prefill_seconds,
        "decode_forward": stats.forward_seconds,
        "token_picking": stats.pick_seconds,
        "host_per_step": stats.host_seconds,
        "forming_a_batch": stats.forming_seconds,
        "idle_no_request": stats.idle_seconds,
    }
    worker["other"] = wall - sum(worker.values())
    flows = len(trajectories)
    planner_seconds = sum(float(t.get("seconds") or 0.0) for t in planner)
    per_flow = {  # mean seconds one rollout spent in each, of its wall time
        "planner_calls_decoding": planner_seconds / flows,
        "planner_calls_queued": stats.queue_seconds / flows,
        "tools": tool_time.seconds / flows,
        "engine_calls": engine_time.seconds / flows,
    }
    mean_wall = sum(r.metadata["wall_seconds"] for r in trajectories) / flows
    per_flow["host_in_flow"] = mean_wall - sum(per_flow.values())
    figures = {
        "rollouts": flows,
        "planner_calls": len(planner),
        "completion_tokens": tokens,
        "seconds": wall,
        "completion_tokens_per_second": tokens / wall,
        "batch_capacity": rows,
        "occupancy": stats.occupancy(rows),
        "mean_rows_per_decode_step": stats.row_steps / max(stats.steps, 1),
        "decode_steps": stats.steps,
        "mean_prompt_tokens": sum(len(t.get("prompt_ids") or []) for t in planner) / len(planner),
        "worker_seconds": worker,
        "per_rollout_seconds": per_flow | {"wall": mean_wall},
        "tool_calls": tool_time.calls,
        "engine_calls": engine_time.calls,
        "decode_stats": stats.as_dict(),
    }
    return figures, trajectories


def grpo_config(args: argparse.Namespace, folder: str, **settings: Any) -> Any:
    """TRL's config for one step on the bench's batch (questions x G), device and budget."""
    from trl import GRPOConfig

    return GRPOConfig(
        output_dir=str(args.work / folder),
        per_device_train_batch_size=args.questions * args.group,
        num_generations=args.group,
        max_steps=1,
        max_completion_length=args.tokens,
        report_to="none",
        save_strategy="no",
        bf16=args.device == "cuda",
        use_cpu=args.device != "cuda",
        seed=0,
        **settings,
    )


def run_update(
    args: argparse.Namespace, policy: HFPolicy, context: Context, trajectories: list
) -> dict:
    """One offline Flow-GRPO update on the rollouts (every planner turn a row), under the
    context they ran with."""
    from flowlearn.training.trainer import FlowGRPOTrainer

    config = grpo_config(
        args, "update", learning_rate=1e-6, loss_type="dapo", beta=0.0, temperature=1.0
    )
    trainer = FlowGRPOTrainer.offline(
        policy.model,
        args=config,
        trajectories=trajectories,
        context=context,
        processing_class=policy.tokenizer,
    )
    began = time.perf_counter()
    trainer.train()
    return {"seconds": time.perf_counter() - began, "rollouts": len(trajectories)}


class TRLArm:
    """TRL's generation path (`GRPOTrainer._generate`) on the flow's planner prompts."""

    def __init__(self, args: argparse.Namespace, policy: HFPolicy, prompts: list[str]) -> None:
        import datasets
        from trl import GRPOTrainer

        self.args, self.runs, self.seen = args, [], {}
        config = grpo_config(args, "trl", temperature=1.0, top_p=1.0, top_k=0)
        self.trainer = GRPOTrainer(
            model=policy.model,
            reward_funcs=[lambda completions, **kwargs: [0.0] * len(completions)],
            args=config,
            train_dataset=datasets.Dataset.from_list([{"prompt": p} for p in prompts]),
            processing_class=policy.tokenizer,
        )
        single_turn = self.trainer._generate_single_turn

        def timed(prompt_ids: Any, *rest: Any, **kwargs: Any) -> Any:
            self.seen["prompt_tokens"] = sum(len(p) for p in prompt_ids) / len(prompt_ids)
            completion_ids, logprobs = single_turn(prompt_ids, *rest, **kwargs)
            self.seen["tokens"] = sum(len(c) for c in completion_ids)
            return completion_ids, logprobs

        self.trainer._generate_single_turn = timed
        self.batch = [p for p in prompts for _ in range(args.group)]
        self.trainer.model.eval()

    def warm_up(self) -> None:
        on_own_thread(lambda: (self.trainer._generate(self.batch), self.sync()))  # as the flow's

    def once(self) -> float:
        def timed() -> None:
            self.sync()
            began = time.perf_counter()
            self.trainer._generate(self.batch)
            self.sync()
            seconds = time.perf_counter() - began
            self.runs.append((self.seen["tokens"] / seconds, self.seen["tokens"]))

        on_own_thread(timed)
        return float(self.runs[-1][0])

    def sync(self) -> None:
        if self.args.device == "cuda":
            torch.cuda.synchronize()

    def result(self) -> dict:
        per_second, tokens = middle(self.runs, key=lambda run: run[0])  # as the flow's
        return {
            "completions": len(self.batch),
            "completion_tokens": tokens,
            "seconds": tokens / per_second,
            "completion_tokens_per_second": per_second,
            "repeats": [run[0] for run in self.runs],
            "mean_prompt_tokens": self.seen["prompt_tokens"],
        }


def load(args: argparse.Namespace) -> HFPolicy:
    """The model both arms use: built afresh (same seed, same weights) for each arm."""
    if args.tiny or args.device == "cuda":
        shape, dtype = (TINY, torch.float32) if args.tiny else (QWEN25_05B, torch.bfloat16)
        tok = tokenizer(args.work / "tokenizer")
        built = model(shape, tok, args.device, dtype, attn=args.attn)
        return HFPolicy(built, tok, version=args.model_name)
    if args.attn is None:
        return HFPolicy.from_pretrained(args.planner, device=args.device)
    loaded, tok = load_model_and_tokenizer(
        args.planner, device=args.device, model_kwargs={"attn_implementation": args.attn}
    )
    return HFPolicy(loaded, tok, version=args.model_name)


def breakdown(flow: dict, update: dict | None) -> list[str]:
    wall = flow["seconds"]
    lines = [f"flow wall time {wall:.1f} s: where the batching worker spent it"]
    lines += [
        f"  {name:<18} {seconds:8.2f} s {100 * seconds / wall:5.1f}%"
        for name, seconds in flow["worker_seconds"].items()
    ]
    per = flow["per_rollout_seconds"]
    lines.append(f"one rollout's {per['wall']:.1f} s (mean), by what it waited on")
    lines += [
        f"  {name:<22} {seconds:8.2f} s {100 * seconds / per['wall']:5.1f}%"
        for name, seconds in per.items()
        if name != "wall"
    ]
    if update is not None:
        lines.append(f"update (one offline step on these rollouts): {update['seconds']:.2f} s")
    lines.append(
        f"occupancy {flow['occupancy']:.2f} (mean {flow['mean_rows_per_decode_step']:.1f} rows "
        f"busy of {flow['batch_capacity']} over {flow['decode_steps']} decode steps)"
    )
    return lines


def headlines(args: argparse.Namespace, speeds: dict[str, list[float]]) -> list[dict[str, Any]]:
    """The published figures: each flow arm's tokens/s over TRL's, and the flow's over each
    arm that turns one source off (what that source gives), pair by pair in each repeat."""
    batch = f"{args.questions} x {args.group} rollouts, {args.tokens} tokens a call"
    arms = [name for name in speeds if name != "trl"]
    found = [
        headline(
            f"rollout tokens/s, {arm.replace('_', ' ')} over TRL",
            ratios(speeds[arm], speeds["trl"]),
            "x",
            f"{WHAT[arm]} vs TRL's GRPOTrainer generation on the same first-turn prompts, "
            f"{batch}, {args.model_name}",
        )
        for arm in arms
    ]
    return found + [
        headline(
            f"rollout tokens/s, flow over {arm.replace('_', ' ')}",
            ratios(speeds["flow"], speeds[arm]),
            "x",
            f"the flow vs {WHAT[arm]}: what that source gives, {batch}, {args.model_name}",
        )
        for arm in arms
        if arm != "flow"
    ]


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--tiny", action="store_true", help="a tiny random Qwen2 on CPU")
    mode.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--planner", default="default-base", help="model on CPU (default-base)")
    parser.add_argument("--questions", type=int, help="Q (cpu 2, tiny 4, cuda 4)")
    parser.add_argument("--group", type=int, help="G, rollouts per question (8)")
    parser.add_argument("--tokens", type=int, help="completion budget a call (cpu/tiny 64, 256)")
    parser.add_argument("--turns", type=int, help="the flow's planner turns (2)")
    parser.add_argument(
        "--concurrency",
        type=int,
        help="flow: rollouts in flight and batch capacity (default Q x G, TRL's batch, as the "
        "trainer's default rollout_concurrency)",
    )
    parser.add_argument("--max-wait", type=float, default=0.05, help="batching wait (0.05 s)")
    parser.add_argument(
        "--attn",
        help="both arms' attention kernel, transformers' attn_implementation (sdpa, eager, "
        "flash_attention_2, a Hub kernel); default: the model's own (sdpa)",
    )
    parser.add_argument(
        "--repeats",
        type=int,
        help="timed batches per arm after its warm-up, the arms alternating; the median pair "
        "ratio and its range are reported (tiny 5, cpu and cuda 3)",
    )
    parser.add_argument(
        "--arms",
        default=",".join(VARIANTS),
        help=f"the flow's arms, comma-separated, `flow` first (default: all, {','.join(VARIANTS)})",
    )
    parser.add_argument("--no-update", action="store_true", help="skip the update's timing")
    parser.add_argument("--out", type=Path, help="JSON path (bench/results/rollout_speed_...)")
    parser.add_argument("--work", type=Path, default=Path("/tmp/flowlearn-rollout-speed"))
    args = parser.parse_args(argv)
    if args.tiny:
        args.device = "tiny"
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device here (--tiny checks the script on CPU)")
    defaults = DEFAULTS[args.device]
    names = ("questions", "group", "tokens", "turns", "repeats")
    for name, value in zip(names, defaults, strict=True):
        if getattr(args, name) is None:
            setattr(args, name, value)
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1")
    if args.repeats < MIN_REPEATS:
        parser.error(f"--repeats must be >= {MIN_REPEATS}: a figure is a median with its range")
    args.arms = [arm.strip() for arm in args.arms.split(",") if arm.strip()]
    unknown = sorted(set(args.arms) - set(VARIANTS))
    if unknown or not args.arms or args.arms[0] != "flow" or len(set(args.arms)) < len(args.arms):
        parser.error(
            f"--arms {','.join(args.arms)}: name each of {', '.join(VARIANTS)} at most once, "
            "`flow` first" + (f" ({', '.join(unknown)} unknown)" if unknown else "")
        )
    if args.tiny:
        args.device, args.machine, args.model_name = "cpu", "cpu", "tiny-qwen2-random"
    elif args.device == "cuda":
        name = torch.cuda.get_device_name()
        args.machine = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
        args.model_name = "qwen2.5-0.5b-shaped-random-bf16"
    else:
        args.machine, args.model_name = "cpu", args.planner
    suffix = "_tiny" if args.tiny else ""
    args.out = args.out or RESULTS / f"rollout_speed_{args.machine}{suffix}.json"
    args.prompts = AGENTFLOW_PROMPTS
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(124))  # `timeout`: keep what finished
    report = Report(args.out)
    report.data = provenance("rollout_speed.py", argv) | {
        "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
        "model": args.model_name,
        "prompt_set": args.prompts.name,
        "settings": {
            k: vars(args)[k]
            for k in ("questions", "group", "tokens", "turns", "repeats", "attn", "arms")
        }
        | {
            "max_wait_s": args.max_wait,
            "batch": args.questions * args.group,
            "flow_concurrency": args.concurrency or args.questions * args.group,
        },
    }
    report.say(f"rollout speed on {report.data['device']}, {args.model_name}: {report.data}")
    report.save()
    try:
        flow_policy = load(args)
        flows = {variant: FlowArm(args, flow_policy, variant) for variant in args.arms}
        prompts = flows["flow"].warm_up()
        for variant, arm in flows.items():
            if variant != "flow":
                arm.warm_up()
        trl_policy = load(args)  # its own copy of the same weights
        report.data["settings"]["attn_used"] = sorted(  # what each arm's model runs, as loaded
            {p.handle.model.config._attn_implementation for p in (flow_policy, trl_policy)}
        )
        trl_arm = on_own_thread(lambda: TRLArm(args, trl_policy, prompts))
        trl_arm.warm_up()
        report.say(
            f"{args.repeats} time(s) each, taking turns (the order reversed every other "
            f"repeat): the flow's {args.questions * args.group} rollouts ({flows['flow'].rows} at"
            f" once, up to {args.turns} planner turns each) as {', '.join(flows)}, and TRL's "
            f"GRPOTrainer._generate on {len(prompts)} prompts x {args.group} ..."
        )
        timed = {"flow": flows["flow"].once, "trl": trl_arm.once}
        timed |= {variant: arm.once for variant, arm in flows.items() if variant != "flow"}

        def said(repeat: int, speeds: dict[str, float]) -> None:
            report.say(
                f"  repeat {repeat + 1}: "
                + ", ".join(f"{name} {speed:.1f}" for name, speed in speeds.items())
                + f" tokens/s (flow/trl {speeds['flow'] / speeds['trl']:.3f})"
            )

        speeds = alternate(timed, args.repeats, warm_up=False, on_repeat=said)
        over_trl = {variant: ratios(speeds[variant], speeds["trl"]) for variant in flows}
        flow, trajectories = flows["flow"].result()
        trl = trl_arm.result()
        report.data["flow"], report.data["trl"] = flow, trl
        report.data["tokens_per_second"] = {name: spread(v) for name, v in speeds.items()}
        report.data["over_trl"] = over_trl
        report.data["variants"] = {
            variant: arm.result()[0] for variant, arm in flows.items() if variant != "flow"
        }
        report.data["repeat_ratios"] = over_trl["flow"]["values"]
        report.say(
            f"flow: {flow['completion_tokens']} planner tokens in {flow['seconds']:.1f} s: "
            f"{flow['completion_tokens_per_second']:.1f} tokens/s (median repeat)"
        )
        report.say(
            f"trl: {trl['completion_tokens']} tokens in {trl['seconds']:.1f} s: "
            f"{trl['completion_tokens_per_second']:.1f} tokens/s (median repeat; prompts of "
            f"{trl['mean_prompt_tokens']:.0f} tokens; the flow's first turns "
            f"{flow['mean_prompt_tokens']:.0f} on average over all turns)"
        )
        for variant, summary in over_trl.items():
            report.say(figure_line(f"{variant}_over_trl_tokens_per_second", summary))
        report.save()
        del trl_arm
        update = None
        if not args.no_update:
            report.say("update: one offline Flow-GRPO step on the rollouts ...")
            update = run_update(args, flow_policy, flows["flow"].context, trajectories)
            report.data["update"] = update
            report.say(f"update: {update['seconds']:.2f} s")
            report.save()
        report.data["flow_over_trl_tokens_per_second"] = over_trl["flow"]["median"]
        report.data["headlines"] = headlines(args, speeds)
        for line in breakdown(flow, update):
            report.say(line)
        report.say(figure_line("flow_over_trl_tokens_per_second", over_trl["flow"]))
    except BaseException as exc:
        report.data["error"] = f"{type(exc).__name__}: {exc}"
        report.say(f"stopped: {report.data['error']}; figures so far in {args.out}")
        raise
    finally:
        report.save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
