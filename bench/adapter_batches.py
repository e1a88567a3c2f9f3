"""Two nodes' calls under their own LoRA adapters: one mixed batch, or a batch per adapter.

The decode loop of a continuous batch runs one forward per step. With two trained nodes in
flight (say 8 planner rows and 8 verifier rows), each step can run as
- `mixed`: one forward of all rows, PEFT choosing each row's adapter (`adapter_names=[...]`,
  PEFT's mixed-adapter batches: each LoRA layer runs every adapter on its rows);
- `grouped`: one forward per adapter on its own rows, the adapter switched between them
  (`engine.adapters.switch_adapter`), which is what `BatchingPolicy` per node does.
Both arms decode the same prompts for the same number of steps from the same KV caches, on the
same model (each repeat prefills its caches afresh, untimed). After an untimed warm-up of each
arm, the arms run `--repeats` times (3), their order reversed every other repeat. Prints each
arm's median seconds per decode step and the median and min-max of the pair ratios grouped/mixed
(one a repeat) as `grouped_over_mixed_seconds=<median> pairs=<n> range=<min>-<max>` (below 1:
grouping is faster). PEFT refuses `adapter_names` in training mode, so `mixed` could serve
rollouts only. Writes every repeat's seconds, the provenance (commit, command, machine, load) and
the `headlines` to bench/results/adapter_batches.json (`--out`; with `--tiny`, only to `--out`).

Run: `python bench/adapter_batches.py [--model default-base] [--rows 8] [--prompt 256]
[--steps 32] [--repeats 3] [--device cpu] [--out PATH]`; `--tiny` uses a tiny random model (a
smoke run). About 1.5 min at the defaults on 2 CPU cores (estimated from the step times of
the kept result).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

import torch
from measure import (
    RESULTS,
    alternate,
    check_repeats,
    figure_line,
    headline,
    provenance,
    ratios,
    spread,
    write_result,
)
from peft import LoraConfig

from flowlearn.engine.adapters import switch_adapter
from flowlearn.engine.loading import load_model_and_tokenizer
from flowlearn.training.roles import with_node_adapters

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


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="default-base")
    parser.add_argument("--rows", type=int, default=8, help="rows per node (8)")
    parser.add_argument("--prompt", type=int, default=256, help="prompt tokens (256)")
    parser.add_argument("--steps", type=int, default=32, help="decode steps timed (32)")
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats of each arm (3)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--tiny", action="store_true", help="a tiny random model (a smoke run)")
    parser.add_argument(
        "--out", type=Path, help="JSON path (bench/results/adapter_batches.json; --tiny: none)"
    )
    args = parser.parse_args(argv)
    check_repeats(args.repeats)
    if not args.tiny:
        args.out = args.out or RESULTS / "adapter_batches.json"
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    torch.manual_seed(0)
    model = two_node_model(args.model, args.device, args.tiny)
    vocab = model.config.vocab_size
    ids = torch.randint(3, vocab, (2 * args.rows, args.prompt), device=args.device)
    per_row = [NODES[0]] * args.rows + [NODES[1]] * args.rows

    def mixed() -> float:
        return decode(model, ids, args.steps, per_row)

    def grouped() -> float:
        seconds = 0.0
        for k, node in enumerate(NODES):  # a batch per adapter, one after the other
            switch_adapter(model, node)
            seconds += decode(model, ids[k * args.rows : (k + 1) * args.rows], args.steps, None)
        return seconds

    def report(repeat: int, seconds: dict[str, float]) -> None:
        print(
            f"  repeat {repeat + 1}: "
            + ", ".join(f"{k} {v * 1000:.1f} ms a step" for k, v in seconds.items())
        )

    print(f"2 x {args.rows} rows, {args.steps} steps, {args.repeats} repeats ...", flush=True)
    with torch.no_grad():
        times = alternate({"mixed": mixed, "grouped": grouped}, args.repeats, on_repeat=report)
    ratio = ratios(times["grouped"], times["mixed"])
    result: dict[str, Any] = provenance("adapter_batches.py", argv) | {
        "model": "tiny" if args.tiny else args.model,
        "device": args.device,
        "rows_per_node": args.rows,
        "prompt_tokens": args.prompt,
        "decode_steps": args.steps,
        "repeats": args.repeats,
        "seconds_per_step": {arm: spread(values) for arm, values in times.items()},
        "grouped_over_mixed_seconds": ratio,
    }
    result["headlines"] = [
        headline(
            "decode step, a batch per adapter over one mixed batch",
            ratio,
            "x",
            f"a decode step of 2 x {args.rows} rows under two LoRA adapters: a forward per "
            "adapter, switched between them, vs one forward with PEFT's per-row adapter_names",
        )
    ]
    if args.out is not None:
        write_result(args.out, result)
    for arm, seconds in result["seconds_per_step"].items():
        print(f"{arm}: {seconds['median'] * 1000:.1f} ms a decode step (median of {args.repeats})")
    wrote = f"; wrote {args.out}" if args.out is not None else ""
    print(figure_line("grouped_over_mixed_seconds", ratio) + wrote)
    return 0


if __name__ == "__main__":
    sys.exit(main())
