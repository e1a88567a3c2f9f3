"""One batched decoding step: transformers' stock `DynamicCache` vs `appending_cache`, side by side.

Run: `python bench/decode_step.py [--rows 16 --cached 450 --rounds 25]`. Both caches are filled by
the same prompt read, then decode one step each in turn, round after round, so drift on a shared
machine falls on both; prints the median and fastest step of each and their ratio, and writes
them to bench/results/decode_step.json (`--out`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from transformers.cache_utils import DynamicCache

from flowlearn.engine.kv_cache import appending_cache
from flowlearn.engine.loading import load_model_and_tokenizer

RESULTS = Path(__file__).parent / "results" / "decode_step.json"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--planner", help="model (default: the embedded SmolLM2-135M)")
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--cached", type=int, default=450, help="tokens already in the cache")
    parser.add_argument("--rounds", type=int, default=25, help="decoding steps of each cache")
    parser.add_argument("--out", type=Path, default=RESULTS, help="JSON path (%(default)s)")
    args = parser.parse_args()
    model, _ = load_model_and_tokenizer(args.planner, device="cpu")
    torch.manual_seed(0)
    ids = torch.randint(0, 1000, (args.rows, args.cached))
    config = model.config
    caches = {"stock": DynamicCache(config=config), "appending": appending_cache(config)}
    with torch.no_grad():
        out = model(input_ids=ids, cache=caches["stock"], use_cache=True, logits_to_keep=1)
        model(input_ids=ids, cache=caches["appending"], use_cache=True, logits_to_keep=1)
    token = out.logits[:, -1].argmax(-1, keepdim=True)
    mask = torch.ones(args.rows, args.cached, dtype=torch.long)
    times: dict[str, list[float]] = {name: [] for name in caches}
    for step in range(args.rounds):
        mask = torch.cat([mask, mask.new_ones(args.rows, 1)], 1)
        positions = torch.full((args.rows, 1), args.cached + step)
        for name, cache in caches.items():
            start = time.perf_counter()
            with torch.no_grad():
                model(input_ids=token, attention_mask=mask, position_ids=positions, cache=cache)
            times[name].append(time.perf_counter() - start)
    result = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "torch_threads": torch.get_num_threads(),
        "rows": args.rows,
        "cached_tokens": args.cached,
        **{
            name: {
                "median_ms": 1000 * statistics.median(t[1:]),
                "fastest_ms": 1000 * min(t[1:]),
            }
            for name, t in times.items()
        },
    }
    result["median_ratio"] = result["stock"]["median_ms"] / result["appending"]["median_ms"]
    print(json.dumps(result, indent=2))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
