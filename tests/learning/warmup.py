"""A tiny planner for the learning test, warmed up on the output format with random tools."""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tiny_model import build_tiny_model

from flowlearn.engine.local import chat_prompt_ids

TOOLS = ["python", "local_search"]
FORMAT = " {tool}\nSub-Goal: answer the question{filler}"
"""What the policy writes after the prefilled `Tool Name:`: the tool first, the filler after
it, so the choice is read before any filler. With the filler first (a justification line and
the sub-goal, then the tool name, as the product's prompt had it), one CI run learned to
sample two or three fillers (completions of 8 and 10 tokens) and greedy decoding then failed
every held-out question at one and at two turns (0.50 -> 0.00) while its training reward
reached 1.0: greedy filler does not end where sampled filler does."""
FILLERS = ["zork", "quux", "blip", "frob", "wug", "glim"]
"""Filler words of the sub-goal, 0 to `MAX_FILLERS` of them: completion lengths vary."""
MAX_FILLERS = 5
WORDS = [*TOOLS, "+", "capital", *FILLERS]
"""Kept whole by the tokenizer. Its merges cross spaces, so the template becomes a few long
tokens (a prompt is about 70), but the words a choice depends on must stay shared tokens:
merged into the text around them, every held-out question would read as new tokens."""


def planner_output(tool: str, rng: random.Random) -> str:
    """`FORMAT` with a sub-goal of 0 to `MAX_FILLERS` random filler words."""
    words = rng.choices(FILLERS, k=rng.randint(0, MAX_FILLERS))
    return FORMAT.format(filler="".join(f" {w}" for w in words), tool=tool)


def build_policy(folder: Path, texts: Sequence[str], seed: int) -> tuple[Any, Any]:
    """A byte-level BPE fitted to the task's prompts and a small Qwen2 (hidden 64, 2 layers).

    Weights are drawn with std 0.1 instead of 0.02: at 0.02 attention is near uniform over the
    70 tokens and the last position hardly sees the question, so no gradient separates the two
    question types and learning stalls at chance (supervised learning too, after the warm-up).
    """
    import torch
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    build_tiny_model(
        folder, seed, texts=list(texts), vocab_size=4000, hidden_size=64, whole_text=True
    )
    tokenizer = PreTrainedTokenizerFast.from_pretrained(folder)
    tokenizer.add_tokens(WORDS)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(folder)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.Linear | torch.nn.Embedding):
                module.weight.normal_(0.0, 0.1)
    model.resize_token_embeddings(len(tokenizer), mean_resizing=False)
    return model, tokenizer


def warm_up_format(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[list[dict[str, str]]],
    *,
    steps: int = 300,
    lr: float = 3e-3,
    seed: int = 0,
) -> None:
    """Supervised steps on `FORMAT` with a random tool and filler per example: the format, not
    the task."""
    import torch

    rng = random.Random(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    for step in range(steps):
        prompt = chat_prompt_ids(tokenizer, prompts[step % len(prompts)])  # the prefill too
        answer = tokenizer(
            planner_output(rng.choice(TOOLS), rng) + "<|im_end|>", add_special_tokens=False
        )["input_ids"]
        ids = torch.tensor([list(prompt) + answer])
        labels = ids.clone()
        labels[0, : len(prompt)] = -100
        model(input_ids=ids, labels=labels).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.eval()
