"""One batched decoding step: transformers' stock `DynamicCache` vs `appending_cache`, side by side.

Run: `python bench/decode_step.py [--rows 16 --cached 450 --rounds 25]` (`--repeats` is another
name for `--rounds`; at least 3). Both caches are filled by the same prompt read, then each
decodes one untimed warm-up step; then, round after round, each cache decodes one step, the
caches' order reversed every other round, so drift on a shared machine falls on both. The figure
is the median and min-max of the per-round pair ratios stock/appending (above 1: the appending
cache is faster); each cache's median and fastest step are printed too. Writes every round's
step times, the provenance (commit, command, machine, load) and the `headlines` to
bench/results/decode_step.json (`--out`). About 30 s at the defaults on 2 CPU cores (estimated
from the kept step times).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

import torch
from measure import (
    MIN_REPEATS,
    RESULTS,
    alternate,
    figure_line,
    headline,
    provenance,
    ratios,
    spread,
    write_result,
)
from transformers.cache_utils import DynamicCache

from flowlearn.engine.kv_cache import appending_cache
from flowlearn.engine.loading import load_model_and_tokenizer


def stepper(model: Any, cache: Any, token: torch.Tensor, cached: int) -> Callable[[], float]:
    """A callable that decodes the next step into `cache` and returns its seconds."""
    rows = token.shape[0]
    state = {"mask": torch.ones(rows, cached, dtype=torch.long), "step": 0}

    def step() -> float:
        state["mask"] = mask = torch.cat([state["mask"], state["mask"].new_ones(rows, 1)], 1)
        positions = torch.full((rows, 1), cached + state["step"])
        state["step"] += 1
        start = time.perf_counter()
        with torch.no_grad():
            model(input_ids=token, attention_mask=mask, position_ids=positions, cache=cache)
        return time.perf_counter() - start

    return step


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--planner", help="model (default: the embedded SmolLM2-135M)")
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--cached", type=int, default=450, help="tokens already in the cache")
    parser.add_argument(
        "--rounds", "--repeats", dest="rounds", type=int, default=25, help="timed steps a cache"
    )
    parser.add_argument("--out", type=Path, default=RESULTS / "decode_step.json", help="JSON path")
    args = parser.parse_args(argv)
    if args.rounds < MIN_REPEATS:
        parser.error(f"--rounds {args.rounds}: a figure needs at least {MIN_REPEATS} rounds")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    model, _ = load_model_and_tokenizer(args.planner, device="cpu")
    torch.manual_seed(0)
    ids = torch.randint(0, 1000, (args.rows, args.cached))
    config = model.config
    caches = {"stock": DynamicCache(config=config), "appending": appending_cache(config)}
    with torch.no_grad():
        out = model(input_ids=ids, cache=caches["stock"], use_cache=True, logits_to_keep=1)
        model(input_ids=ids, cache=caches["appending"], use_cache=True, logits_to_keep=1)
    token = out.logits[:, -1].argmax(-1, keepdim=True)
    arms = {name: stepper(model, cache, token, args.cached) for name, cache in caches.items()}
    print(
        f"{args.rows} rows over {args.cached} cached tokens, {args.rounds} rounds ...", flush=True
    )
    seconds = alternate(arms, args.rounds)  # one untimed step of each first
    ms = {name: [1000 * s for s in values] for name, values in seconds.items()}
    ratio = ratios(ms["stock"], ms["appending"])
    result: dict[str, Any] = provenance("decode_step.py", argv) | {
        "model": getattr(model.config, "name_or_path", "default"),
        "torch_threads": torch.get_num_threads(),
        "rows": args.rows,
        "cached_tokens": args.cached,
        "rounds": args.rounds,
        **{name: {"step_ms": spread(values)} for name, values in ms.items()},
        "stock_over_appending": ratio,
    }
    result["headlines"] = [
        headline(
            "decoding step, stock DynamicCache over appending_cache",
            ratio,
            "x",
            f"one {args.rows}-row decoding step over {args.cached} cached tokens with "
            "transformers' DynamicCache vs the in-place appending_cache",
        )
    ]
    write_result(args.out, result)
    for name in ms:
        step = result[name]["step_ms"]
        print(f"{name}: median {step['median']:.1f} ms, fastest {step['min']:.1f} ms a step")
    print(figure_line("stock_over_appending", ratio) + f"; wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
