"""`flowlearn train --dry-run`: what a validated config will cost and write, no weights loaded.

What it estimates, and why so:
1. Work per step, per process: Q x G rollouts (`questions_per_step` x `num_generations`), at
   most `max_turns` planner calls each, each at most `max_completion_length` tokens: upper
   bounds, since a rollout may stop earlier.
2. GPU memory per device from the model's shape alone (`transformers.AutoConfig`, read offline):
   the weights in the dtype they load in, then gradients and AdamW's two moments for the
   trainable parameters in theirs, a KL reference copy where full fine-tuning needs one, and the
   KV cache of the rollouts in flight. Activations are left out (they depend on the rows'
   lengths; `activation_checkpointing` bounds them), and so is vLLM's own reservation.
3. The files the run writes under `output_dir`, from the run's own file names.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from flowlearn.nodes.schema.context import TRAINING_CONTEXT
from flowlearn.training.metrics import CURVE_FILE, METRICS_FILE
from flowlearn.training.run import ROLLOUTS_FILE, RUN_FILE

BUDGET = TRAINING_CONTEXT.planner_max_new_tokens
"""A planner turn's token budget where the config leaves `max_completion_length` unset."""

GIB = 1024**3
PROMPT_TOKENS = 2048
"""Prompt tokens assumed per planner call for the KV cache when `vllm_max_model_length` is
unset: the flow's planner prompt (question, tools, memory of earlier turns) has no fixed cap."""
SHARDS = 8
"""The process count a full fine-tune's sharded estimate is also given for (one 8-GPU node)."""
DEFAULT_PLANNERS = (None, "default", "default-base")


@dataclass(frozen=True)
class Shape:
    """The sizes of a decoder-only transformer that fix its parameter count and KV cache."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied: bool
    qkv_bias: bool

    def linear_layers(self) -> list[tuple[int, int]]:
        """Return the (in, out) features of one decoder layer's linear maps: q, k, v, o, MLP."""
        h, q, kv, i = (
            self.hidden,
            self.heads * self.head_dim,
            self.kv_heads * self.head_dim,
            self.intermediate,
        )
        return [(h, q), (h, kv), (h, kv), (q, h), (h, i), (h, i), (i, h)]

    def parameters(self) -> int:
        """Count the parameters.

        Per layer its linear maps (+ q, k, v biases) and two RMSNorms; then the embedding, a
        final norm, and the LM head unless tied to the embedding.
        """
        bias = (self.heads + 2 * self.kv_heads) * self.head_dim if self.qkv_bias else 0
        per_layer = sum(a * b for a, b in self.linear_layers()) + bias + 2 * self.hidden
        head = 0 if self.tied else self.vocab * self.hidden
        return self.layers * per_layer + self.vocab * self.hidden + self.hidden + head

    def lora_parameters(self, r: int) -> int:
        """Count LoRA's parameters: r x (in + out) on each linear map of every layer.

        "all-linear", as `with_lora` targets; PEFT leaves the LM head out.
        """
        return self.layers * sum(r * (a + b) for a, b in self.linear_layers())

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """Return layers x 2 (K and V) x kv_heads x head_dim x bytes: one token's KV cache."""
        return self.layers * 2 * self.kv_heads * self.head_dim * dtype_bytes


def read_shape(model: str | None) -> tuple[Shape | None, str]:
    """Read the model's shape with `AutoConfig`, offline (a folder, or the hub cache).

    Returns:
        The shape, or None and why it could not be read.

    """
    if model in DEFAULT_PLANNERS or str(model).endswith(".gguf"):
        return None, f"planner {model or 'default'} is a .gguf file, which AutoConfig cannot read"
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(str(model), local_files_only=True)
    except (OSError, ValueError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return None, f"the config of {model} cannot be read offline ({first})"
    text = config.get_text_config()
    heads = int(text.num_attention_heads)
    hidden = int(text.hidden_size)
    shape = Shape(
        hidden=hidden,
        layers=int(text.num_hidden_layers),
        heads=heads,
        kv_heads=int(getattr(text, "num_key_value_heads", None) or heads),
        head_dim=int(getattr(text, "head_dim", None) or hidden // heads),
        intermediate=int(text.intermediate_size),
        vocab=int(text.vocab_size),
        tied=bool(getattr(text, "tie_word_embeddings", False)),
        qkv_bias=bool(getattr(text, "attention_bias", text.model_type == "qwen2")),
    )
    return shape, ""


def dtype_bytes(name: Any) -> int:
    """Return the bytes per element of a dtype name (`bfloat16`, `float16`, `float32`)."""
    return 4 if "32" in str(name) else 2


def memory(config: Any, shape: Shape) -> list[tuple[str, int]]:
    """Return the memory one device holds, part by part, in bytes, unsharded.

    Weights load as `model_init_kwargs` says, else as flowlearn loads them: half precision
    under LoRA (the base is cast down), fp32 for full fine-tuning. Trainable parameters add a
    gradient and two AdamW moments each in their own dtype: LoRA's adapter is fp32 (PEFT), so
    16 bytes a parameter with its weight; full fine-tuning 3 x the weights' bytes more. A full
    fine-tune with `beta` > 0 holds a KL reference copy (LoRA's is the base, adapter off). The
    KV cache holds `rollout_concurrency` (default Q x G) sequences of prompt + completion tokens
    in half precision; an engine left unset is a frozen half-precision copy of the planner's.
    """
    total, half = shape.parameters(), 2
    named = (config.model_init_kwargs or {}).get("dtype")
    weight = dtype_bytes(named) if named else (half if config.lora else 4)
    parts = [("weights", total * weight)]
    if config.lora:
        adapter = shape.lora_parameters(config.lora_r)
        parts += [("LoRA adapter, gradients, AdamW (fp32)", adapter * 16)]
    else:
        parts += [("gradients", total * weight), ("AdamW moments", 2 * total * weight)]
        if config.beta:
            parts += [("KL reference copy", total * weight)]
    if config.engine is None:
        parts += [("engine (frozen copy)", total * half)]
    if not config.use_vllm:  # under use_vllm the planner's cache is in vLLM's reservation
        tokens = rollout_concurrency(config) * context_tokens(config)
        parts += [("KV cache", tokens * shape.kv_bytes_per_token(half))]
    return parts


def rollout_concurrency(config: Any) -> int:
    """Return the rollouts in flight per process: `rollout_concurrency`, default Q x G."""
    return int(config.rollout_concurrency or config.questions_per_step * config.num_generations)


def context_tokens(config: Any) -> int:
    """Return the tokens one sequence's KV cache holds: vLLM's cap, else prompt + completion."""
    return int(
        config.vllm_max_model_length or PROMPT_TOKENS + (config.max_completion_length or BUDGET)
    )


def step_lines(config: Any) -> list[str]:
    """Describe one step's rollouts, planner calls and planner tokens (upper bounds)."""
    processes = int(os.environ.get("WORLD_SIZE", "1"))
    rollouts = config.questions_per_step * config.num_generations
    calls = rollouts * config.max_turns
    tokens = calls * (config.max_completion_length or BUDGET)
    lines = [
        "step (per process; upper bounds):",
        f"  rollouts: {rollouts} ({config.questions_per_step} questions x "
        f"{config.num_generations} generations)",
        f"  planner calls: {calls} (x max_turns {config.max_turns})",
        f"  planner tokens: {tokens:,} (x max_completion_length {config.max_completion_length})",
        f"  optimizer updates: {config.steps_per_generation // config.gradient_accumulation_steps}"
        f" of {config.per_device_train_batch_size} x {config.gradient_accumulation_steps} rollouts",
    ]
    if processes == 1:
        lines.append("  under accelerate, each process runs this much: multiply by the processes")
    return lines


def memory_lines(config: Any, shape: Shape | None, why: str) -> list[str]:
    """Describe the GPU memory per device, or say why it cannot be estimated."""
    if shape is None:
        return ["GPU memory per device: not estimated: " + why]
    parts = memory(config, shape)
    lines = [
        f"GPU memory per device ({shape.parameters():,} parameters; activations and vLLM's "
        "reservation not included):"
    ]
    lines += [f"  {name}: {size / GIB:.2f} GiB" for name, size in parts]
    lines.append(f"  total: {sum(size for _, size in parts) / GIB:.2f} GiB")
    if not config.lora:
        sharded = ("weights", "gradients", "AdamW moments", "KL reference copy")
        total = sum(size // SHARDS if name in sharded else size for name, size in parts)
        lines.append(
            f"  total sharded over {SHARDS} processes (FSDP full shard or ZeRO-3): "
            f"{total / GIB:.2f} GiB"
        )
    if config.use_vllm:
        lines.append(
            f"  plus vLLM ({config.vllm_mode}): its weights and KV cache, "
            f"{config.vllm_gpu_memory_utilization:g} of each GPU's memory in colocate mode"
        )
    else:
        lines.append(
            f"  (KV cache: {rollout_concurrency(config)} rollouts x {context_tokens(config)} "
            f"tokens x {shape.kv_bytes_per_token(2):,} bytes a token)"
        )
    return lines


def output_lines(config: Any) -> list[str]:
    """List what the run writes under `output_dir`."""
    out = str(config.output_dir)
    lines = [
        f"writes under {out}:",
        f"  {RUN_FILE}, {ROLLOUTS_FILE}, {METRICS_FILE}, {CURVE_FILE}",
        f"  checkpoint-N/ every {config.save_steps:g} steps of {config.max_steps}"
        + (f", the last {config.save_total_limit} kept" if config.save_total_limit else ""),
        "  final/ (the policy `flowlearn run --planner` loads)",
    ]
    if config.lora:
        lines.append("  final-adapter/ (the LoRA adapter alone)")
    if config.planner_url and not config.adapter_dir:
        lines.append("  adapters/ (each step's adapter, for the vLLM server)")
    return lines


def report(config: Any) -> str:
    """Return the dry run's report of a validated config; nothing is loaded or written."""
    shape, why = read_shape(config.planner)
    lines = [f"config valid: planner {config.planner or 'default'}; nothing loaded or written"]
    lines += step_lines(config) + memory_lines(config, shape, why) + output_lines(config)
    return "\n".join(lines)
