"""Ship a trained planner adapter as the package's default planner (`--planner default`).

Copies a LoRA adapter folder written by `flowlearn train` (a `checkpoint-N/` or
`final-adapter/`) into `engine/data/default_planner/`: its `adapter_config.json`, and
its weights cast to float16 (half the size; peft casts them to the planner's precision as it
merges them, and the held-out figures in the README are measured on the shipped files). Writes
`SOURCE.json` beside them: where the adapter came from, the recipe that trained it (`--recipe`,
default `examples/learn_tools.yaml`; a joined adapter from
`research/default-planner/stack_adapters.py` names its
warm recipe) and its size.

    python research/default-planner/ship_adapter.py runs/learn-tools/checkpoint-16
    python research/default-planner/ship_adapter.py runs/warm-8 --recipe
    research/default-planner/learn_tools_warm.yaml
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from flowlearn.engine.loading import DEFAULT_MODEL_NAME, SHIPPED_ADAPTER

WEIGHTS = "adapter_model.safetensors"
ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "examples" / "learn_tools.yaml"


def ship(folder: Path, target: Path = SHIPPED_ADAPTER, recipe: Path = RECIPE) -> Path:
    """Write the adapter in `folder` to `target` in float16; return the weights' path."""
    config = folder / "adapter_config.json"
    if not config.is_file() or not (folder / WEIGHTS).is_file():
        raise SystemExit(
            f"{folder} holds no LoRA adapter ({config.name} and {WEIGHTS}): pass a "
            "checkpoint-N/ or final-adapter/ folder of a `flowlearn train` run with lora: true"
        )
    if not recipe.is_file():
        raise SystemExit(
            f"--recipe {recipe} is not a file: name the YAML the adapter was trained with "
            f"(default {RECIPE.relative_to(ROOT)})"
        )
    named = Path(os.path.abspath(recipe))  # as named: a linked recipe keeps its own name
    if not named.is_relative_to(ROOT):  # e.g. run from a linked checkout
        named = recipe.resolve()
    named = named.relative_to(ROOT) if named.is_relative_to(ROOT) else named
    tensors = {name: t.to(torch.float16) for name, t in load_file(folder / WEIGHTS).items()}
    target.mkdir(parents=True, exist_ok=True)
    settings = json.loads(config.read_text())
    # the training machine's cache path says nothing elsewhere; peft merges into the loaded base
    settings["base_model_name_or_path"] = DEFAULT_MODEL_NAME
    (target / config.name).write_text(json.dumps(settings, indent=2) + "\n")
    save_file(tensors, target / WEIGHTS)
    source = {
        "from": str(folder),
        "recipe": named.as_posix(),
        "parameters": sum(t.numel() for t in tensors.values()),
        "dtype": "float16",
        "bytes": (target / WEIGHTS).stat().st_size,
    }
    (target / "SOURCE.json").write_text(json.dumps(source, indent=2) + "\n")
    return target / WEIGHTS


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="the adapter folder of a training run")
    parser.add_argument("--recipe", type=Path, default=RECIPE, help="the YAML that trained it")
    args = parser.parse_args()
    print(ship(args.folder, recipe=args.recipe))
