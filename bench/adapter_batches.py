"""Two nodes' calls under their own LoRA adapters: one mixed batch, or a batch per adapter.

The decode loop of a continuous batch runs one forward per step. With two trained nodes in
flight (say 8 planner rows and 8 verifier rows), each step can run as
- `mixed`: one forward of all rows, PEFT choosing each row's adapter (`adapter_names=[...]`,
  PEFT's mixed-adapter batches: each LoRA layer runs every adapter on its rows);
- `grouped`: one forward per adapter on its own rows, the adapter switched between them
  (`engine.adapters.switch_adapter`), which is what `BatchingPolicy` per node does.
Both arms decode the same prompts for the same number of steps from the same KV caches, on the
same model; the arms alternate `--repeats` times. Prints each arm's seconds per decode step and
`grouped_over_mixed_seconds=<ratio>` (below 1: grouping is faster). PEFT refuses
`adapter_names` in training mode, so `mixed` could serve rollouts only.

Run: `python bench/adapter_batches.py [--model default-base] [--rows 8] [--prompt 256]
[--steps 32] [--repeats 3] [--device cpu]`; `--tiny` uses a tiny random model (a smoke run).
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path
from typing import Any

import torch
from peft import LoraConfig

from flowlearn.engine.adapters import switch_adapter
from flowlearn.engine.loading import load_model_and_tokenizer
from flowlearn.training.roles import with_node_adapters

RESULTS = Path(__file__).parent / "results" / "adapter_batches.json"
NODES = ("planner", "verifier")


def two_node_model(name: str, device: str, tiny: bool) -> Any:
    """The model with a planner and a verifier adapter (B non-zero: they differ)."""
    if tiny:
        from transformers import Qwen2Config, Qwen2ForCausalLM

        config = Qwen2Config(
            vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2,
        )  # fmt: skip
        model: Any = Qwen2ForCausalLM(config)
    else:
        model, _ = load_model_and_tokenizer(name, device=device)
    settings = LoraConfig(r=16, lora_alpha=32, target_modules="all-linear", task_type="CAUSAL_LM")
    peft_model = with_node_adapters(model, {n: settings for n in NODES}).to(device).eval()
    with torch.no_grad():
        for parameter_name, parameter in peft_model.named_parameters():
            if "lora_B" in parameter_name:
                parameter.normal_(0, 0.01)
    return peft_model


def prefill(model: Any, ids: torch.Tensor, adapters: list[str] | None) -> Any:
    """Return the KV cache and next tokens of `ids` (one adapter per row, or the active one)."""
    extra = {"adapter_names": adapters} if adapters is not None else {}
    out = model(input_ids=ids, use_cache=True, **extra)
    return out.past_key_values, out.logits[:, -1:].argmax(-1)


def decode(model: Any, ids: torch.Tensor, steps: int, adapters: list[str] | None) -> float:
    """Time `steps` greedy decode steps after prefilling `ids`; return seconds per step."""
    cache, token = prefill(model, ids, adapters)
    extra = {"adapter_names": adapters} if adapters is not None else {}
    sync(ids.device)
    start = time.perf_counter()
    for _ in range(steps):
        out = model(input_ids=token, past_key_values=cache, use_cache=True, **extra)
        cache, token = out.past_key_values, out.logits[:, -1:].argmax(-1)
    sync(ids.device)
    return (time.perf_counter() - start) / steps


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="default-base")
    parser.add_argument("--rows", type=int, default=8, help="rows per node")
    parser.add_argument("--prompt", type=int, default=256, help="prompt tokens")
    parser.add_argument("--steps", type=int, default=32, help="decode steps timed")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--tiny", action="store_true")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    model = two_node_model(args.model, args.device, args.tiny)
    vocab = model.config.vocab_size
    ids = torch.randint(3, vocab, (2 * args.rows, args.prompt), device=args.device)
    per_row = [NODES[0]] * args.rows + [NODES[1]] * args.rows
    times: dict[str, list[float]] = {"mixed": [], "grouped": []}
    with torch.no_grad():
        for _ in range(args.repeats):
            times["mixed"].append(decode(model, ids, args.steps, per_row))
            grouped = 0.0
            for k, node in enumerate(NODES):  # a batch per adapter, one after the other
                switch_adapter(model, node)
                rows = ids[k * args.rows : (k + 1) * args.rows]
                grouped += decode(model, rows, args.steps, None)
            times["grouped"].append(grouped)
    best = {arm: min(values) for arm, values in times.items()}
    ratio = best["grouped"] / best["mixed"]
    result = {
        "machine": f"{platform.node()} {platform.processor() or platform.machine()} "
        f"{torch.get_num_threads()} threads, {args.device}",
        "model": "tiny" if args.tiny else args.model,
        "rows_per_node": args.rows,
        "prompt_tokens": args.prompt,
        "decode_steps": args.steps,
        "seconds_per_step": best,
        "grouped_over_mixed_seconds": ratio,
    }
    if not args.tiny:
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(json.dumps(result, indent=1) + "\n")
    for arm, seconds in best.items():
        print(f"{arm}: {seconds * 1000:.1f} ms a decode step (best of {args.repeats})")
    print(f"grouped_over_mixed_seconds={ratio:.3f}")


if __name__ == "__main__":
    main()
