"""The trained model under TRL: fp32 trainable weights, no dropout, a KL reference, forwards.

Why:
1. AdamW stepping bf16 weights loses every update below half the weight's last bit: at lr 1e-6
   only 2.3% of a bf16 model's weights moved in 10 steps, against 100% in fp32. So trainable
   weights are fp32 (the master weights) and `bf16=True` makes the compute bf16 under autocast,
   the usual mixed-precision recipe. Frozen weights (a LoRA base, the reference) stay as loaded.
2. TRL builds the KL reference with `from_pretrained(model.config._name_or_path)`: that fails
   for a GGUF planner (no folder) and silently takes the on-disk checkpoint for a model changed
   in memory. The reference here is a frozen copy of the model as it is when training starts;
   under LoRA it is the model itself with its adapter switched off (or TRL's "ref" copy of a
   pretrained adapter), so the weights are not held twice.
3. Rollouts sample in eval mode, so their logged logprobs carry no dropout; a training forward
   with dropout would not be the policy that sampled.
4. The no-grad forwards over a step's padded batch (the reference's logprobs, recomputed old
   ones) are TRL's own forward, so they score exactly as TRL's loss does.
"""

from __future__ import annotations

import copy
import logging
import pickle
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from flowlearn.engine.adapters import adapter_names, switch_adapter
from flowlearn.engine.loading import (
    load_model_and_tokenizer,
    parameter_count,
    pick_device_and_dtype,
)
from flowlearn.engine.local import trainability_kept
from flowlearn.errors import SavedModelError, TrainingDivergedError

logger = logging.getLogger(__name__)


def check_finite_weights(model: Any) -> None:
    """Refuse a model with a NaN or infinite weight: a policy that can only answer garbage.

    Raises:
        TrainingDivergedError: naming the first such parameter.

    """
    for name, parameter in model.named_parameters():
        if parameter.is_floating_point() and not bool(torch.isfinite(parameter.detach()).all()):
            raise TrainingDivergedError(
                f"the trained weight {name} holds NaN or infinite values; the policy is not "
                "saved. Training diverged: check the data's rewards, lower the learning rate, "
                "or resume from an earlier checkpoint"
            )


def upcast_trainable(model: Any) -> int:
    """Cast trainable half-precision weights to fp32 in place; return how many were cast.

    The tensors are swapped under the same parameters (`param.data`), so the model object,
    its tied weights and every policy and handle built on it stay the same; the rollouts then
    sample with the fp32 weights (the policy being trained, exactly).
    """
    if not isinstance(model, torch.nn.Module):
        return 0  # a model id: TRL loads it, in fp32 unless `model_init_kwargs` say otherwise
    cast = 0
    for param in model.parameters():
        if param.requires_grad and param.is_floating_point() and param.element_size() < 4:
            param.data = param.data.float()
            cast += 1
    if cast:
        logger.info(
            "%d trainable weight tensors were in half precision: cast to fp32 (master weights); "
            "bf16=True computes in bf16 under autocast",
            cast,
        )
    return cast


def frozen_reference(model: Any, beta: float) -> Any | None:
    """Return a frozen copy of `model` as it is now, to be the KL reference, or None.

    None where no copy is needed: beta 0, a PEFT model (the adapter switch gives the
    reference), or a model id that TRL loads itself (its reference is that same checkpoint).
    Call it before TRL patches the model's forward, and before `upcast_trainable`, so a bf16
    model gets a bf16 reference.
    """
    from accelerate.utils import is_peft_model

    if beta == 0.0 or not isinstance(model, torch.nn.Module) or is_peft_model(model):
        return None
    reference = copy.deepcopy(model)
    # A forward patched by an earlier trainer closes over the original model: drop it.
    reference.__dict__.pop("forward", None)
    reference.requires_grad_(False)
    return reference.eval()


@contextmanager
def reference_kept_from_trl(
    args: Any, reference: Any | None, *, node_adapters: bool = False
) -> Iterator[None]:
    """Hide beta (and `sync_ref_model`) from TRL's constructor while it runs, given a reference.

    So TRL builds no reference from the model's folder; `install_reference` sets both back.
    With `node_adapters` (an adapter per trained node) it is hidden too: TRL would copy an
    adapter named "default" into a "ref" one, and every node's reference is the base with its
    adapters off (`reference_logps`).
    """
    if reference is None and not node_adapters:
        yield
        return
    saved = args.beta, args.sync_ref_model
    args.beta, args.sync_ref_model = 0.0, False
    try:
        yield
    finally:
        args.beta, args.sync_ref_model = saved


def install_reference(trainer: Any, reference: Any | None) -> None:
    """Give `trainer` the in-memory `reference`, set up as TRL sets up the one it builds."""
    from trl.models.utils import prepare_deepspeed, prepare_fsdp
    from trl.trainer.callbacks import SyncRefModelCallback
    from trl.trainer.utils import add_fused_lm_head, disable_dropout_in_model

    args = trainer.args
    trainer.beta = args.beta
    if reference is None:
        return
    prepared: Any
    if args.disable_dropout:
        disable_dropout_in_model(reference)
    if args.cast_lm_head_to_fp32:
        reference.get_output_embeddings().float()
    add_fused_lm_head(
        reference,
        temperature=trainer.temperature,
        cast_lm_head_to_fp32=args.cast_lm_head_to_fp32,
    )
    if trainer.is_deepspeed_enabled:
        prepared = prepare_deepspeed(reference, trainer.accelerator)
    elif trainer.is_fsdp_enabled:
        prepared = prepare_fsdp(reference, trainer.accelerator)
    else:
        prepared = trainer.accelerator.prepare_model(reference, evaluation_mode=True)
    trainer.ref_model = prepared
    if args.sync_ref_model:
        sync = SyncRefModelCallback(ref_model=prepared, accelerator=trainer.accelerator)
        trainer.add_callback(sync)


def warn_on_dropout(model: Any, disable_dropout: bool) -> None:
    """Warn when the model trains with dropout that its rollouts sampled without."""
    if disable_dropout or not isinstance(model, torch.nn.Module):
        return
    active = [m for m in model.modules() if isinstance(m, torch.nn.Dropout) and m.p > 0]
    if active:
        logger.warning(
            "%d dropout layers stay on in training (disable_dropout=False) while rollouts sample "
            "without dropout, so the ratio to the logged logprobs is off by the dropout noise; "
            "set disable_dropout=True (FlowGRPOConfig's default)",
            len(active),
        )


def forward_logps(trainer: Any, model: Any, tensors: dict[str, Any]) -> Any:
    """Return the completion tokens' logprobs under `model`, as TRL's loss computes them.

    TRL's own forward (`_get_per_token_logps_and_entropies`: its temperature, its autocast),
    without gradients, in chunks of the per-device batch so its peak memory is a micro-batch's.
    """
    ids = torch.cat([tensors["prompt_ids"], tensors["completion_ids"]], dim=1)
    mask = torch.cat([tensors["prompt_mask"], tensors["completion_mask"]], dim=1)
    with torch.no_grad():
        logps, _, _ = trainer._get_per_token_logps_and_entropies(
            model,
            ids,
            mask,
            tensors["completion_ids"].size(1),
            batch_size=trainer.args.per_device_train_batch_size,
        )
    return logps


def reference_logps(trainer: Any, tensors: dict[str, Any]) -> Any:
    """Return the KL reference's logprobs over the batch's completions.

    The reference is the in-memory frozen copy, or under LoRA the model with its adapter off
    (TRL's "ref" adapter instead, where TRL copied a pretrained adapter).
    """
    if trainer.ref_model is not None:
        return forward_logps(trainer, trainer.ref_model, tensors)
    from trl.trainer.utils import use_adapter

    model = trainer.accelerator.unwrap_model(trainer.model)
    ref = "ref" if "ref" in model.peft_config else None
    with trainability_kept(model), use_adapter(model, adapter_name=ref):  # node adapters too
        return forward_logps(trainer, trainer.model, tensors)


def recompute_old_logps(trainer: Any, tensors: dict[str, Any]) -> None:
    """Replace the logged old logprobs with the training forward's, and log their gap.

    As verl does: the ratio's denominator then comes from the same kernels, precision and
    batch shapes as its numerator, so at the first update the ratio is 1 exactly; the logged
    ones differ by the numerics of generation (bf16 and KV-cached decoding). The gap is the
    metric `flow/old_logprob_gap`, the mean |logged - recomputed| over completion tokens.
    With an adapter per trained node (`flow_node`), each node's rows are scored under its own.
    """
    if "flow_node" in tensors:
        recomputed = node_logps(trainer, tensors)
    else:
        recomputed = forward_logps(trainer, trainer.model, tensors)
    mask = tensors["completion_mask"].bool()
    if bool(mask.any()):
        gap = (tensors["old_per_token_logps"] - recomputed).abs()[mask].mean()
        trainer._metrics["train"]["flow/old_logprob_gap"].append(float(gap))
    tensors["old_per_token_logps"] = recomputed.to(tensors["old_per_token_logps"].dtype)


def node_logps(trainer: Any, tensors: dict[str, Any]) -> Any:
    """Return `forward_logps` of every row under its own node's adapter (`flow_node`).

    Padding rows (node -1) are scored with the first node's and carry no completion token.
    """
    live = trainer.accelerator.unwrap_model(trainer.model)
    index = tensors["flow_node"]
    keys = ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask")
    out = None
    for k, node in enumerate(trainer.roles.nodes):
        rows = ((index == k) | ((index < 0) & (k == 0))).nonzero().squeeze(1)
        if not len(rows):
            continue
        switch_adapter(live, node)
        logps = forward_logps(trainer, trainer.model, {key: tensors[key][rows] for key in keys})
        if out is None:
            out = logps.new_zeros(index.size(0), logps.size(1))
        out[rows] = logps
    return out


def load_planner(
    config: Any, source: str, cache_dir: str | None, device: str | None
) -> tuple[Any, Any, bool]:
    """Load the planner in the precision its training wants; return it, its tokenizer, `lora`.

    Full fine-tuning loads fp32: the master weights come straight from the checkpoint, and
    `bf16` makes the compute bf16 under autocast. Under LoRA the frozen base loads as for
    inference (bf16 on CUDA) and PEFT keeps the adapter fp32. `config.lora` unset means on
    above 1B parameters, counted from the config before loading; a GGUF file (whose header
    costs about as much to read as a load) loads fp32 first and, under LoRA, casts its base
    down.
    """
    lora = config.lora
    init, dtype = init_kwargs(config)
    if lora is None and not str(source).endswith(".gguf"):
        lora = parameter_count(source, cache_dir) > 1e9
    if lora is not None:
        check_kernel(init, lora, dtype, device)
    model, tokenizer = load_model_and_tokenizer(
        source,
        device=device,
        dtype=dtype or (None if lora else "float32"),
        cache_dir=cache_dir,
        model_kwargs=init,
    )
    if lora is None:
        lora = model.num_parameters() > 1e9
        check_kernel(init, lora, dtype, device)
        if lora and dtype is None:  # the base as for inference, unless a dtype was asked for
            model.to(pick_device_and_dtype(device, None)[1])
    return model, tokenizer, bool(lora)


NO_REMOTE_CODE = (
    "not supported: flowlearn loads models with the code transformers ships, never code from a "
    "model's repository"
)


def init_kwargs(config: Any) -> tuple[dict[str, Any], str | None]:
    """Return `config.model_init_kwargs` as the planner's `from_pretrained` keywords, and a dtype.

    TRL's convention: `{"attn_implementation": "sdpa", "dtype": "bfloat16"}`. The dtype (or
    transformers' older `torch_dtype`) is the precision the weights load in, one of TRL's
    (bfloat16, float16, float32, auto); trainable weights are still trained in fp32
    (`upcast_trainable`). The device is flowlearn's to choose, so a `device_map`,
    `quantization_config` or dtype of None (TRL's own defaults) is dropped.

    Raises:
        ValueError: a `device_map`, a `quantization_config`, `trust_remote_code`, `cache_dir`,
            `gguf_file` or `revision`, which flowlearn sets or cannot honour for every load of
            the run; a `token` (it would be saved with the config); a dtype TRL does not take,
            or two dtypes.

    """
    given = config.model_init_kwargs or {}
    if not isinstance(given, Mapping):
        raise ValueError(
            f"model_init_kwargs must be a mapping of from_pretrained keywords, got {given!r}"
        )
    init = dict(given)
    for key in ("device_map", "quantization_config", "dtype", "torch_dtype"):
        if key in init and init[key] is None:
            del init[key]
    if init.pop("trust_remote_code", False):
        raise ValueError(f"model_init_kwargs.trust_remote_code: {NO_REMOTE_CODE}")
    if "device_map" in init:
        raise ValueError(
            "model_init_kwargs.device_map: flowlearn places the planner itself (use_cpu, or "
            "one GPU per process under accelerate); drop device_map"
        )
    if "quantization_config" in init:
        raise ValueError(
            "model_init_kwargs.quantization_config is not supported yet: the planner loads in "
            "bf16 or fp32 (LoRA keeps one copy of the base for rollouts and training)"
        )
    for key in sorted({"token", "use_auth_token"} & set(init)):  # a secret in a saved config
        raise ValueError(
            f"model_init_kwargs.{key}: the training config is saved with every checkpoint "
            "(training_args.bin), so a token there would be written to disk; set $HF_TOKEN "
            "(or run `hf auth login`) instead"
        )
    if "gguf_file" in init:
        raise ValueError(
            "model_init_kwargs.gguf_file: the planner is the model named; name the .gguf file "
            "itself as the model (a path ending in .gguf) and drop gguf_file"
        )
    if "cache_dir" in init:  # the engine's twin and a saved result's base load by name too
        raise ValueError(
            "model_init_kwargs.cache_dir: every load of the run (the planner, its untrained "
            "twin as the engine, a saved result's base) reads Hugging Face's cache; set "
            "$HF_HUB_CACHE (or $HF_HOME) instead, or name a local folder as the model"
        )
    if "revision" in init:  # the engine's twin and a saved result's base load by name too
        raise ValueError(
            "model_init_kwargs.revision: the untrained engine and a saved result's base load "
            "the model by name at its default revision, so the run would mix revisions; "
            "download that revision to a folder (`hf download NAME --revision R --local-dir "
            "DIR`) and name the folder as the model"
        )
    named = {k: dtype_name(init.pop(k)) for k in ("dtype", "torch_dtype") if k in init}
    if len(set(named.values())) > 1:
        raise ValueError(f"model_init_kwargs names two dtypes {named}; give one")
    key, dtype = next(iter(named.items()), ("dtype", None))
    if dtype not in (None, *TRL_DTYPES):
        raise ValueError(
            f"model_init_kwargs.{key} {dtype!r} is not one the planner loads in; use "
            f"{', '.join(TRL_DTYPES)} (TRL's)"
        )
    return init, dtype


TRL_DTYPES = ("bfloat16", "float16", "float32", "auto")
"""The dtypes TRL's `model_init_kwargs` take (`create_model_from_path`)."""


def dtype_name(dtype: Any) -> str:
    """`torch.bfloat16` or "bfloat16" as "bfloat16" (TRL takes either)."""
    return str(dtype).removeprefix("torch.")


def check_kernel(
    init: Mapping[str, Any], lora: bool, dtype: str | None, device: str | None
) -> None:
    """Refuse a flash-attention kernel for a planner whose weights decode in fp32.

    Full fine-tuning keeps the trainable weights in fp32 (`upcast_trainable`), and a LoRA
    planner's frozen base is fp32 when asked for (dtype float32) or on a CPU by default. Rollouts
    decode without autocast, so flash attention (fp16 and bf16 only) would fail at the first
    rollout's forward. A dtype of auto (the checkpoint's) is left to the load.

    Raises:
        ValueError: `attn_implementation` names a flash-attention kernel and the planner's
            weights would be fp32.

    """
    kernel = str(init.get("attn_implementation") or "")
    if "flash" not in kernel.lower():
        return
    if not lora:
        raise ValueError(
            f"model_init_kwargs.attn_implementation {kernel!r} runs in fp16 or bf16 only, and "
            f"a fully fine-tuned planner trains and samples with fp32 weights (dtype "
            f"{dtype or 'float32'} loads them, training upcasts them); use sdpa, or lora: true "
            "(the frozen base loads in bf16 on a GPU)"
        )
    base = pick_device_and_dtype(device, dtype)[1]
    if base == torch.float32:
        where = "dtype float32" if dtype else "on a CPU, where it loads fp32 by default"
        raise ValueError(
            f"model_init_kwargs.attn_implementation {kernel!r} runs in fp16 or bf16 only, and "
            f"the LoRA planner's frozen base would be fp32 ({where}); use sdpa, or dtype "
            "bfloat16 on a GPU"
        )


@contextmanager
def init_kwargs_kept_from_trl(args: Any) -> Iterator[None]:
    """Hide `model_init_kwargs` from TRL's constructor, for a planner `load_planner` loaded.

    They were applied at that load; TRL, given a loaded model, would log that it ignores them.
    """
    saved = args.model_init_kwargs
    args.model_init_kwargs = None
    try:
        yield
    finally:
        args.model_init_kwargs = saved


def with_lora(model: Any, config: Any) -> Any:
    """Wrap `model` in a LoRA adapter of `config.lora_r`/`lora_alpha` on all linear layers."""
    from peft import LoraConfig, get_peft_model

    adapter = LoraConfig(
        r=config.lora_r,
        lora_alpha=config.lora_alpha,
        target_modules="all-linear",
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, adapter)


TORCH_FILES = re.compile(
    r"^(rng_state(_\d+)?\.pth|optimizer\.pt|scheduler\.pt|scaler\.pt|"
    r"pytorch_model[\w.-]*\.bin|adapter_model\.bin)$"
)
"""The pickled torch files of a checkpoint that resuming loads (`training_args.bin` is not)."""


def check_checkpoint(folder: Path, model: Any) -> None:
    """Refuse a checkpoint that pickles Python objects, or whose weights are another model's.

    Run before transformers loads it. Every pickled torch file resuming reads is unpickled by
    torch's weights-only loader, memory-mapped so its tensors are not read; one holding other
    objects is refused here, with none of torch's advice to load it unsafely. Each safetensors
    file's shapes (its header only) are compared with `model`'s weights of the same name.

    Raises:
        SavedModelError: naming the file and what is wrong with it.

    """
    folders = [folder, *(p for p in sorted(folder.iterdir()) if p.is_dir())]
    for file in (f for d in folders for f in sorted(d.iterdir()) if TORCH_FILES.match(f.name)):
        check_torch_file(file)
    expected = model_shapes(model)
    for file in (f for d in folders for f in sorted(d.glob("*.safetensors"))):
        for key, shape in safetensors_shapes(file).items():
            if key in expected and expected[key] != shape:
                raise SavedModelError(
                    f"checkpoint {folder} holds weights of a model of another size: {key} in "
                    f"{file.name} is {shape}, the model being trained has {expected[key]}. "
                    "Resume with the model that run trained, or start afresh in a new output_dir"
                )


def check_torch_file(file: Path) -> None:
    """Unpickle `file` as torch's weights-only loader does, its tensors memory-mapped, not read.

    Raises:
        SavedModelError: a file that holds Python objects beyond tensors and plain values.

    """
    from transformers.trainer_pt_utils import safe_globals

    try:
        with safe_globals():  # type: ignore[no-untyped-call]  # numpy RNG states, as transformers
            try:
                torch.load(file, map_location="cpu", weights_only=True, mmap=True)
            except RuntimeError as exc:  # an old-format file cannot be mapped: read it
                if "mmap" not in str(exc):
                    raise
                torch.load(file, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        found = re.search(r"Unsupported (global: GLOBAL [\w.]+|operand[^\n.]*)", str(exc))
        what = f" ({found.group(0).strip()})" if found else ""
        raise SavedModelError(
            f"checkpoint file {file} holds pickled Python objects{what}, which flowlearn does "
            "not load: unpickling them can run any code. Resume from a checkpoint that "
            "training wrote, or start afresh in a new output_dir"
        ) from None
    except (RuntimeError, EOFError, OSError) as exc:
        raise SavedModelError(f"checkpoint file {file} does not load ({exc})") from None


def safetensors_shapes(file: Path) -> dict[str, list[int]]:
    """Return each tensor's shape in a safetensors file, from its header alone.

    Raises:
        SavedModelError: a file that is not safetensors.

    """
    from safetensors import safe_open

    try:
        with safe_open(str(file), framework="pt") as handle:
            names = handle.keys()
            return {key: list(handle.get_slice(key).get_shape()) for key in names}
    except Exception as exc:  # safetensors raises its own error types for a bad header
        raise SavedModelError(f"{file} is not a safetensors file ({exc})") from None


def model_shapes(model: Any) -> dict[str, list[int]]:
    """Return `model`'s weight shapes by the names a checkpoint saves them under.

    A PEFT adapter's weights are saved without the adapter's name
    (`...q_proj.lora_A.weight`, not `...q_proj.lora_A.planner.weight`).
    """
    names = "|".join(re.escape(n) for n in adapter_names(model))
    shapes = {}
    for key, value in model.state_dict().items():
        if names and "lora_" in key:
            key = re.sub(rf"\.({names})(?=\.|$)", "", key)
        shapes[key] = list(value.shape)
    return shapes
