"""Build a tiny planner for the learning test and warm it up on the output format only."""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tiny_model import build_tiny_model

FORMAT = "Sub-Goal: answer the question\nTool Name: {tool}"


def build_policy_model(folder: Path, texts: Sequence[str], seed: int = 0) -> Path:
    """A byte-level BPE fitted to the task's prompts and a small Qwen2, saved to `folder`."""
    return build_tiny_model(
        folder, seed, texts=list(texts), vocab_size=4000, hidden_size=64, whole_text=True
    )


def warm_up_format(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[list[dict[str, str]]],
    tools: Sequence[str],
    epochs: int = 3,
    seed: int = 0,
) -> None:
    """Supervised steps on `FORMAT` with a random tool per example: format, not the task."""
    import torch

    rng = random.Random(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(epochs):
        for messages in prompts:
            prompt = tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=True, return_dict=False
            )
            answer = tokenizer(
                FORMAT.format(tool=rng.choice(tools)) + "<|im_end|>", add_special_tokens=False
            )["input_ids"]
            ids = torch.tensor([list(prompt) + answer])
            labels = ids.clone()
            labels[0, : len(prompt)] = -100
            loss = model(input_ids=ids, labels=labels).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    model.eval()
