"""Join a LoRA adapter trained on the shipped planner to the shipped adapter: one exact adapter.

`research/default-planner/learn_tools_warm.yaml` trains a new LoRA on the default planner, i.e. on
the embedded
SmolLM2 with the shipped adapter merged in. LoRA deltas add, so base + shipped + new is the base
under one adapter whose A and B matrices stack the two (rank 16 + 16 = 32): peft's
`add_weighted_adapter(..., combination_type="cat")`, which peft documents as exact. The joined
folder is an ordinary adapter of the untrained model, so `research/default-planner/tool_choice.py`
and
`research/default-planner/ship_adapter.py` (then `flowlearn eval --planner default`) read it like
any checkpoint.

    python research/default-planner/stack_adapters.py runs/learn-tools-warm/checkpoint-8 --out
    runs/warm-8
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import torch

from flowlearn.engine.loading import SHIPPED_ADAPTER, load_model_and_tokenizer


def stack(new: Path, out: Path, shipped: Path = SHIPPED_ADAPTER) -> Any:
    """Write `shipped` + `new` as one adapter to `out`; return the PEFT model holding it."""
    from peft import PeftModel

    base, _ = load_model_and_tokenizer("default-base", device="cpu", dtype="float32")
    model = PeftModel.from_pretrained(base, shipped, adapter_name="shipped")
    model.load_adapter(new, adapter_name="new")
    model.add_weighted_adapter(["shipped", "new"], [1.0, 1.0], "default", combination_type="cat")
    model.set_adapter("default")
    model.save_pretrained(out, selected_adapters=["default"])  # "default": saved in out/ itself
    return model


@torch.no_grad()
def check(model: Any, new: Path) -> float:
    """The largest logit gap between the stacked adapter and shipped-merged + new, on one input."""
    from peft import PeftModel

    ids = torch.arange(1, 65)[None]
    model.eval()
    stacked = model(ids).logits
    merged, _ = load_model_and_tokenizer("default", device="cpu", dtype="float32")
    chained = PeftModel.from_pretrained(merged, new).eval()(ids).logits
    return float((stacked - chained).abs().max())


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "new", type=Path, help="a checkpoint-N/ of research/default-planner/learn_tools_warm.yaml"
    )
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    joined = stack(args.new, args.out)
    print(f"{args.out}: logit gap to the chained adapters {check(joined, args.new):.2e}")
