"""GPU check: Flow-GRPO steps through the real flow vs TRL's stock GRPOTrainer, side by side.

Run: `python bench/gpu_train.py` on a machine with one CUDA GPU (`--tiny` runs a small model on
CPU, to check the script itself). A randomly initialised model of the Qwen2.5-0.5B configuration
in bf16 is the planner; the fixed engine is scripted, so the measured time is the policy's.
Both trainers get the same model configuration, group size, batch and completion budget; the
JSON written to bench/results/gpu_train.json holds rollout and update seconds, completion
tokens per second and peak GPU memory of each, and their ratios. It also runs the rollout
benchmark of `bench/rollouts.py` on the same model: 16 flows, batched (`BatchingPolicy`, under
planner and engine) vs one at a time, with its trajectories per second and their ratio.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

import rollouts
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM
from trl import GRPOConfig, GRPOTrainer

from flowlearn.evals.cases import Case
from flowlearn.evals.scorers import Score
from flowlearn.graphs import Context
from flowlearn.nodes.policies.scripted import ScriptedChatModel as FakeChatModel
from flowlearn.nodes.prompts import PLANNER_PROMPT, QUERY_ANALYSIS_PROMPT
from flowlearn.nodes.tools import python_tool
from flowlearn.training.metrics import read_metrics
from flowlearn.training.trainer import FlowGRPOTrainer

RESULTS = Path(__file__).parent / "results" / "gpu_train.json"
QWEN25_05B = dict(
    hidden_size=896,
    intermediate_size=4864,
    num_hidden_layers=24,
    num_attention_heads=14,
    num_key_value_heads=2,
    vocab_size=151936,
    tie_word_embeddings=True,
    max_position_embeddings=32768,
)
TINY = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=2048,
    tie_word_embeddings=True,
    max_position_embeddings=4096,
)


CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
"""A ChatML template for the locally built tokenizer."""


def tokenizer(folder: Path) -> Any:
    """A byte-level BPE fitted to the flow's prompt templates (no hub access needed)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok.train_from_iterator(
        [PLANNER_PROMPT, QUERY_ANALYSIS_PROMPT] * 50,
        trainers.BpeTrainer(
            vocab_size=2000,
            special_tokens=specials,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        ),
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        chat_template=CHATML,
    )
    fast.save_pretrained(folder)
    return fast


def model(shape: dict[str, Any], tok: Any, device: str, dtype: Any) -> Any:
    """A randomly initialised Qwen2 of the given shape."""
    torch.manual_seed(0)
    config = Qwen2Config(**shape, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    return Qwen2ForCausalLM(config).to(device=device, dtype=dtype)


def engine() -> FakeChatModel:
    """Scripted fixed engine: instant, so the timings are the policy's."""

    def respond(messages: list[Any], tools: list[dict[str, Any]]) -> Any:
        from langchain_core.messages import AIMessage

        if tools:
            call = {"name": tools[0]["name"], "args": {"code": "print(1)"}, "id": "1"}
            return AIMessage("", tool_calls=[call])
        prompt = str(messages[-1].content)
        if prompt.startswith("Judge whether"):
            return "Conclusion: CONTINUE"
        return "<answer>1</answer>" if prompt.startswith("Answer") else "Analysis: arithmetic."

    return FakeChatModel(respond=respond)


def grpo_config(out: Path, args: argparse.Namespace, cuda: bool, **extra: Any) -> GRPOConfig:
    return GRPOConfig(
        output_dir=str(out),
        per_device_train_batch_size=args.questions * args.group,
        num_generations=args.group,
        steps_per_generation=1,
        gradient_accumulation_steps=1,
        max_steps=args.steps,
        learning_rate=1e-6,
        temperature=1.0,
        loss_type="dapo",
        beta=0.0,
        max_completion_length=args.tokens,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        bf16=cuda,
        use_cpu=not cuda,
        seed=0,
        **extra,
    )


def run_flow(args: argparse.Namespace, tok: Any, device: str, dtype: Any, out: Path) -> dict:
    cuda = device == "cuda"
    policy = model(args.shape, tok, device, dtype)
    rng = random.Random(0)
    cases = [
        Case(str(i), f"What is {rng.randint(2, 99)} + {rng.randint(2, 99)}?", "0")
        for i in range(args.questions * args.steps)
    ]
    trainer = FlowGRPOTrainer.online(
        policy,
        args=grpo_config(out / "flow", args, cuda),
        engine=engine(),
        tools=[python_tool()],
        scorer=lambda answer, case: Score(float(random.random() < 0.5), "random reward"),
        cases=cases,
        context=Context(
            max_turns=args.turns, planner_temperature=1.0, planner_max_new_tokens=args.tokens
        ),
        processing_class=tok,
    )
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    trainer.train()
    total = time.perf_counter() - start
    records = read_metrics(out / "flow" / "metrics.jsonl")[1:]  # the first step warms up
    rollout = statistics.mean(r["flow/rollout_seconds"] for r in records)
    update = statistics.mean(r["flow/update_seconds"] for r in records)
    tokens = statistics.mean(r["flow/tokens"] for r in records)
    return {
        "steps": args.steps,
        "seconds_total": total,
        "rollout_seconds_per_step": rollout,
        "update_seconds_per_step": update,
        "completion_tokens_per_step": tokens,
        "completion_tokens_per_second": tokens / (rollout + update),
        "peak_gpu_memory_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
    }


def random_reward(completions: list[Any], **kwargs: Any) -> list[float]:
    """Rewards for the stock trainer: only the update's cost is measured."""
    return [random.random() for _ in completions]


def run_stock(args: argparse.Namespace, tok: Any, device: str, dtype: Any, out: Path) -> dict:
    import datasets

    cuda = device == "cuda"
    policy = model(args.shape, tok, device, dtype)
    prompt = PLANNER_PROMPT.format(
        question="What is 12 + 30?",
        analysis="Analysis: arithmetic.",
        tools="- python: run code",
        memory="(no steps yet)",
        step=1,
        max_steps=args.turns,
        tool_names="python",
    )
    data = datasets.Dataset.from_list(
        [{"prompt": [{"role": "user", "content": prompt}]}] * (args.questions * args.steps)
    )
    trainer = GRPOTrainer(
        model=policy,
        reward_funcs=[random_reward],
        args=grpo_config(out / "stock", args, cuda),
        train_dataset=data,
        processing_class=tok,
    )
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    trainer.train()
    total = time.perf_counter() - start
    logs = [h for h in trainer.state.log_history if "step_time" in h][1:]
    times = [h["step_time"] for h in logs]
    lengths = [h.get("completions/mean_length", args.tokens) for h in logs]
    rows = args.questions * args.group
    step = statistics.mean(times)
    return {
        "steps": args.steps,
        "seconds_total": total,
        "seconds_per_step": step,
        "completion_tokens_per_step": statistics.mean(lengths) * rows,
        "completion_tokens_per_second": statistics.mean(lengths) * rows / step,
        "peak_gpu_memory_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
    }


def run_rollouts(args: argparse.Namespace, tok: Any, device: str, dtype: Any) -> dict:
    """bench/rollouts.py's comparison on this model: N flows batched vs one at a time."""
    from flowlearn.nodes.policies.hf import HFPolicy

    policy = HFPolicy(model(args.shape, tok, device, dtype), tok, version="random-qwen2.5-0.5b")
    return rollouts.compare(policy, args.flows, args.rollout_tokens)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="small model on CPU (script check)")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--questions", type=int, default=4)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--turns", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--flows", type=int, default=16, help="rollout bench: flows (16)")
    parser.add_argument(
        "--rollout-tokens", type=int, default=64, help="rollout bench: tokens per call (64)"
    )
    parser.add_argument("--out", type=Path, default=Path("/tmp/flowlearn-gpu-train"))
    args = parser.parse_args()
    cuda = torch.cuda.is_available() and not args.tiny
    if not cuda and not args.tiny:
        raise SystemExit("no CUDA device: run on a GPU machine, or pass --tiny to check on CPU")
    device, dtype = ("cuda", torch.bfloat16) if cuda else ("cpu", torch.float32)
    args.shape = TINY if args.tiny else QWEN25_05B
    tok = tokenizer(args.out / "tokenizer")
    flow = run_flow(args, tok, device, dtype, args.out)
    stock = run_stock(args, tok, device, dtype, args.out)
    batching = run_rollouts(args, tok, device, dtype)
    result = {
        "device": torch.cuda.get_device_name() if cuda else "cpu (--tiny script check)",
        "model": "Qwen2.5-0.5B configuration, random init, bf16" if cuda else "tiny Qwen2, fp32",
        "settings": {k: vars(args)[k] for k in ("steps", "questions", "group", "turns", "tokens")},
        "flow_grpo": flow,
        "trl_grpo": stock,
        "tokens_per_second_ratio_flow_over_stock": flow["completion_tokens_per_second"]
        / stock["completion_tokens_per_second"],
        "rollouts_batched_vs_sequential": batching,
    }
    print(json.dumps(result, indent=2))
    if cuda:
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
