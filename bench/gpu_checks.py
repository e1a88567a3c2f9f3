"""Parts of `bench/gpu_train.py`: its random models, peak memory, and the bf16 weights check.

Stepping bf16 weights directly loses every update below half a weight's last bit: on the tiny
test model 2.3% of the weights moved in 10 updates at lr 1e-6, against 100% in fp32. The
trainer keeps fp32 master weights and computes in bf16 under autocast, so after N updates the
fraction of changed weights should be fp32's and the update close to fp32's (cosine near 1).
Both arms start from the same bf16 weights and train on the same rows, whose logged logprobs
are the starting model's own at temperature 1, so the first ratio is 1 as in a real rollout.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from flowlearn.graphs import Context
from flowlearn.nodes.prompts import AGENTFLOW_PROMPTS
from flowlearn.training import Trajectory, Transition
from flowlearn.training.trainer import FlowGRPOTrainer

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
    """A byte-level BPE fitted to the flow's AgentFlow prompt templates (no hub access needed)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok.train_from_iterator(
        [AGENTFLOW_PROMPTS.template("planner", analysis=True), AGENTFLOW_PROMPTS.query_analysis]
        * 50,
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


def model(shape: dict[str, Any], tok: Any, device: str, dtype: Any, attn: str | None = None) -> Any:
    """A randomly initialised Qwen2 of the given shape (`attn`: transformers' attention kernel)."""
    torch.manual_seed(0)
    config = Qwen2Config(**shape, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    if attn is not None:
        config._attn_implementation = attn  # as from_pretrained(attn_implementation=) sets it
    return Qwen2ForCausalLM(config).to(device=device, dtype=dtype)


def reset_peak(cuda: bool) -> None:
    """Start a new peak-memory window: CUDA's allocator, or this process's RSS high-water mark."""
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    else:
        Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS


def peak_gib(cuda: bool) -> float:
    """Return the peak since `reset_peak`: GPU memory allocated by torch, or the process's RSS."""
    if cuda:
        return torch.cuda.max_memory_allocated() / 2**30
    status = Path("/proc/self/status").read_text()
    found = re.search(r"VmHWM:\s+(\d+)", status)
    return int(found.group(1)) / 2**20 if found else float("nan")


def rows(model: Any, questions: int, group: int, tokens: int, vocab: int) -> list[Trajectory]:
    """Random prompts and completions, logged with `model`'s own logprobs at temperature 1."""
    generator = torch.Generator().manual_seed(0)
    out = []
    for q in range(questions):
        prompt = torch.randint(vocab, (32,), generator=generator).tolist()
        for k in range(group):
            completion = torch.randint(vocab, (tokens,), generator=generator).tolist()
            ids = torch.tensor([prompt + completion], device=model.device)
            with torch.no_grad():
                logits = model(ids).logits[0, len(prompt) - 1 : -1].float()
            logps = torch.log_softmax(logits, -1).gather(1, ids[0, len(prompt) :, None])[:, 0]
            tid = f"{q}/{k}"
            turn = Transition(
                trajectory_id=tid,
                group_id=str(q),
                node="planner",
                turn=1,
                messages=[],
                output="",
                parse_status="ok",
                seconds=0.0,
                prompt_ids=prompt,
                completion_ids=completion,
                logprobs=logps.tolist(),
            )
            reward = float((q + k) % 2)
            out.append(Trajectory(tid, str(q), "q", "r", "a", "a", reward, transitions=[turn]))
    return out


def train_arm(
    model: Any, tok: Any, config: Any, data: list[Trajectory], cuda: bool
) -> tuple[torch.Tensor, dict[str, Any]]:
    """Train `model` offline on `data`; return its flat weight change (on CPU) and figures."""
    start = [p.detach().to("cpu", torch.float32, copy=True) for p in model.parameters()]
    context = Context(
        max_turns=1,
        planner_temperature=config.temperature,
        planner_max_new_tokens=config.max_completion_length,
    )
    trainer = FlowGRPOTrainer.offline(
        model, args=config, trajectories=data, context=context, processing_class=tok
    )
    reset_peak(cuda)
    began = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - began
    delta = torch.cat(
        [
            (p.detach().to("cpu", torch.float32) - s).flatten()
            for p, s in zip(model.parameters(), start, strict=True)
        ]
    )
    figures = {
        "trainable_dtype": str({p.dtype for p in model.parameters() if p.requires_grad}),
        "changed_fraction": (delta != 0).float().mean().item(),
        "seconds": seconds,
        "peak_memory_gib": peak_gib(cuda),
    }
    return delta, figures


def weights_move(
    make_model: Callable[[Any], Any],
    tok: Any,
    make_config: Callable[..., Any],
    args: Any,
    cuda: bool,
) -> dict[str, Any]:
    """Train N updates in bf16 (fp32 master weights, bf16 autocast) and in fp32; compare.

    `make_model(dtype)` builds the same seeded random model each time; `make_config(out,
    **overrides)` the trainer config. The bf16 arm loads bf16 weights (as the loader does on
    CUDA) and lets the trainer upcast them; the fp32 arm starts from those same weights cast.
    """
    fp32 = make_model(torch.bfloat16).float()
    data = rows(fp32, args.questions, args.group, args.tokens, int(fp32.config.vocab_size))
    common = dict(
        max_steps=args.weight_steps, learning_rate=1e-6, max_completion_length=args.tokens
    )
    full, full_figures = train_arm(
        fp32, tok, make_config(args.out / "fp32", **common, bf16=False), data, cuda
    )
    del fp32
    if cuda:
        torch.cuda.empty_cache()
    mixed, mixed_figures = train_arm(
        make_model(torch.bfloat16),
        tok,
        make_config(args.out / "bf16", **common, bf16=True),
        data,
        cuda,
    )
    return {
        "steps": args.weight_steps,
        "learning_rate": 1e-6,
        "bf16_autocast": mixed_figures,
        "fp32": full_figures,
        "changed_fraction_ratio_bf16_over_fp32": mixed_figures["changed_fraction"]
        / max(full_figures["changed_fraction"], 1e-12),
        "update_cosine_bf16_vs_fp32": torch.nn.functional.cosine_similarity(
            mixed, full, dim=0
        ).item(),
        "update_relative_difference": ((mixed - full).norm() / full.norm()).item(),
    }
