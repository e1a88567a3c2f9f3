"""A tiny policy for the learning tests, warmed up on its roles' formats with random choices."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
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
VERDICTS = ["STOP", "CONTINUE"]
VERDICT_FORMAT = "Conclusion: {verdict}"
"""What a trained verifier writes: one line that `parse_verdict` reads at once, so each verdict
is one call. The verdicts join `WORDS` where a verifier is trained: whole tokens, like tools."""


def planner_output(tool: str, rng: random.Random) -> str:
    """`FORMAT` with a sub-goal of 0 to `MAX_FILLERS` random filler words."""
    words = rng.choices(FILLERS, k=rng.randint(0, MAX_FILLERS))
    return FORMAT.format(filler="".join(f" {w}" for w in words), tool=tool)


def build_policy(
    folder: Path, texts: Sequence[str], seed: int, words: Sequence[str] = WORDS
) -> tuple[Any, Any]:
    """A byte-level BPE fitted to the task's prompts and a small Qwen2 (hidden 64, 2 layers);
    `words` are kept whole.

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
    tokenizer.add_tokens(list(words))
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(folder)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.Linear | torch.nn.Embedding):
                module.weight.normal_(0.0, 0.1)
    model.resize_token_embeddings(len(tokenizer), mean_resizing=False)
    return model, tokenizer


Example = tuple[list[dict[str, str]], Callable[[random.Random], str]]
"""A warm-up example: a prompt, and what writes a random reply to it in its role's format."""


def random_plan(rng: random.Random) -> str:
    """A planner reply in `FORMAT`: a random tool and filler."""
    return planner_output(rng.choice(TOOLS), rng)


def random_verdict(rng: random.Random) -> str:
    """A verifier reply in `VERDICT_FORMAT`: a random verdict."""
    return VERDICT_FORMAT.format(verdict=rng.choice(VERDICTS))


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
    warm_up(model, tokenizer, [(p, random_plan) for p in prompts], steps=steps, lr=lr, seed=seed)


def warm_up(
    model: Any,
    tokenizer: Any,
    examples: Sequence[Example],
    *,
    steps: int = 300,
    lr: float = 3e-3,
    seed: int = 0,
    batch_size: int = 1,
) -> None:
    """Supervised steps over `examples` in turn, each with a fresh random reply: every weight of
    the model learns the formats, none of the choices. A step takes `batch_size` examples."""
    import torch

    rng = random.Random(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    for step in range(steps):
        rows = []
        for index in range(step * batch_size, (step + 1) * batch_size):
            messages, write = examples[index % len(examples)]
            prompt = chat_prompt_ids(tokenizer, messages)  # the prefill too
            answer = tokenizer(write(rng) + "<|im_end|>", add_special_tokens=False)["input_ids"]
            rows.append((list(prompt), answer))
        width = max(len(p) + len(a) for p, a in rows)
        ids = torch.full((len(rows), width), tokenizer.pad_token_id)
        labels = torch.full((len(rows), width), -100)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for row, (prompt, answer) in enumerate(rows):
            ids[row, : len(prompt) + len(answer)] = torch.tensor(prompt + answer)
            labels[row, len(prompt) : len(prompt) + len(answer)] = torch.tensor(answer)
            mask[row, : len(prompt) + len(answer)] = 1
        model(input_ids=ids, attention_mask=mask, labels=labels).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.eval()
