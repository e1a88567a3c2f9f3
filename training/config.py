"""The training config: TRL's `GRPOConfig` plus the flow's fields, parsed by TRL's `TrlParser`.

Why it looks like this:
1. The config IS a `GRPOConfig`, so every TRL and transformers option is reachable from YAML
   and from `flowlearn train`; the flow adds only what TRL has no knob for.
2. Where the flow and TRL share a knob it is declared once, by TRL: `num_generations` is G,
   `temperature`, `top_p` and `max_completion_length` are the planner's sampling (`context()`
   builds the run context from them), `scale_rewards` is the advantage scaling.
3. A TRL option the flow cannot honour yet is an error that names it, never a silent no-op.
4. Every value is checked by its field's annotation (`check_values`): type, choice and range,
   key named. Not in argparse: YAML values reach the config as argparse defaults, which
   argparse does not check (`mode: bogus` passes), and PyYAML reads `1e-6` as a string. So
   after parsing every field's value is fitted to its annotation: a number written as a string
   becomes that number, a whole float a whole number where a count is asked; anything else, a
   NaN, an infinity, a fraction where a count is asked, a value outside its `Literal` or enum,
   or outside its range, is an error that names the key and what it accepts.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import math
import types
import typing
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Union, cast

from trl.scripts.utils import TrlParser
from trl.trainer.grpo_config import GRPOConfig

from flowlearn.engine.sampling import MAX_NEW_TOKENS, MAX_TEMPERATURE
from flowlearn.nodes.schema.context import MAX_TURNS, Context
from flowlearn.training.batches import VERL_DUAL_CLIP, check_trainer_batching, resolve_batching
from flowlearn.training.rows import refuse_renamed_mode
from flowlearn.training.vllm.settings import check_server_options, check_vllm_config


def _help(text: str, default: Any, **extra: Any) -> Any:
    return field(default=default, metadata={"help": text, **extra})


FLAG = {"nargs": "?", "const": True}
"""argparse settings that let an optional boolean be given as a bare `--flag`."""


@dataclass
class FlowGRPOConfig(GRPOConfig):
    """Everything a Flow-GRPO run needs; defaults follow the paper where they fit one GPU."""

    # Models
    planner: str | None = _help("Model to train: hub id, folder or .gguf; default: SmolLM2.", None)
    engine: str | None = _help(
        "Fixed engine: a model name, 'base' (the frozen base under LoRA), or unset for a "
        "separate frozen copy of the planner's model.",
        None,
    )
    # Data: exactly one of benchmark, data, trajectories
    benchmark: str | None = _help("Registered benchmark to train on (e.g. gameof24).", None)
    data: str | None = _help("A .json/.jsonl/.parquet file of cases to train on.", None)
    scorer: str | None = _help("Scorer for data (exact_match, math_equal, game24, ...).", None)
    limit: int | None = _help("Use only the first N questions.", None)
    trajectories: str | None = _help(
        "Offline mode: train from an exported trajectory file (.jsonl/.parquet) instead.", None
    )
    # The flow
    questions_per_step: int = _help("Q, questions per update (paper: 32 on 8 GPUs).", 4)
    max_turns: int = _help("Planner turns per rollout (paper: 3 in training).", 3)
    tools: list[str] | None = field(
        default=None, metadata={"help": "Tool names to enable; default: all default tools."}
    )
    corpus: str | None = _help("JSONL corpus for local_search.", None)
    query_analysis: bool | None = _help(
        "See Context.query_analysis; default: the prompt set's choice.", None, **FLAG
    )
    prompts: str | None = _help(
        "Prompt set: agentflow or smollm2; default: smollm2 when the planner or engine is the "
        "embedded default, else agentflow (the planner trains on what it will be served).",
        None,
    )
    engine_max_new_tokens: int | None = _help(
        "Fixed engine tokens per call; default: each role's own (the prompt set's).", None
    )
    mode: Literal["paper", "verl_like", "sequence"] = _help("Flow-GRPO weighting mode.", "paper")
    drop_zero_variance: bool = _help("Drop groups whose rewards are all equal.", False)
    reward_errors: Literal["zero", "drop"] = _help(
        "A rollout whose scorer failed trains with reward 0 (zero) or is left out (drop).", "zero"
    )
    format_penalty: float = _help("Penalty weight for unparseable planner turns.", 0.0)
    step_credit_weight: float = _help(
        "GiGPO-style step credit weight, beyond the paper; 0 turns it off.", 0.0
    )
    step_credit_gamma: float = _help("Discount of the step-credit returns.", 0.95)
    lora: bool | None = _help(
        "Train a LoRA adapter; default: on above 1B parameters.", None, **FLAG
    )
    lora_r: int = _help("LoRA rank.", 16)
    lora_alpha: int = _help("LoRA alpha.", 32)
    resume: bool = _help("Continue from the last complete checkpoint in output_dir.", False)
    recompute_old_logprobs: bool = _help(
        "Take the old logprobs from a no-grad training forward before the update (as verl "
        "does) instead of the logged ones; logs flow/old_logprob_gap.",
        False,
    )
    # The planner on a vLLM server (flowlearn.training.vllm.lora_server)
    planner_url: str | None = _help(
        "Sample the planner on a vLLM server at this base URL (http://HOST:PORT/v1) with "
        "runtime LoRA loading; needs lora. Each step's adapter is loaded into it "
        "(/v1/load_lora_adapter) as flow-RUNID-stepK, the rollouts' model and policy_version.",
        None,
    )
    adapter_dir: str | None = _help(
        "With planner_url: where adapters are written, at the same path for the server "
        "(shared filesystem); default: output_dir/adapters.",
        None,
    )
    engine_url: str | None = _help(
        "Run the fixed engine on a vLLM server at this base URL (planner_url's too: one GPU "
        "serves both); engine names the served model, a folder whose tokenizer loads here.",
        None,
    )
    # TRL's fields with the flow's defaults and meaning
    disable_dropout: bool = _help("No dropout in training: rollouts sample without it.", True)
    num_generations: int | None = _help("G, rollouts per question (paper: 8).", 8)
    temperature: float = _help("Planner sampling temperature, of rollouts and of TRL.", 0.7)
    max_completion_length: int | None = _help("Planner tokens per turn (paper: 2048).", 512)
    per_device_train_batch_size: int | None = _help(  # type: ignore[assignment]
        "Rollouts per micro-step and process, and the most rows (one per planner turn) a "
        "forward and backward pass takes. per_device_train_batch_size x steps_per_generation "
        "must be questions_per_step x num_generations; default: that divided by "
        "steps_per_generation (default gradient_accumulation_steps, so one update per step).",
        None,
    )
    output_dir: str | None = _help("Where checkpoints, logs and the final policy go.", "runs/train")
    beta: float = _help("KL coefficient against the reference (paper: 0.001).", 0.001)
    use_bias_correction_kl: bool = _help(
        "False (default): the paper's and verl's plain k3 KL estimate (`low_var_kl`). True: "
        "TRL's bias-corrected estimate, k3 times the differentiable importance ratio.",
        False,
    )
    epsilon_high: float | None = _help("Upper clip range (official code: 0.3).", 0.3)
    max_steps: int = _help("Updates to run (paper: about 32).", 32)
    logging_steps: float = _help("Log every N steps.", 1)
    save_steps: float = _help("Checkpoint every N steps.", 10)
    seed: int = _help("Seed for data order and initialisation.", 0)
    bf16: bool | None = _help("bf16 training; default: on with CUDA.", None, **FLAG)  # type: ignore[assignment]
    gradient_checkpointing: bool | None = _help(  # type: ignore[assignment]
        "Trade compute for memory (transformers 5: activation_checkpointing); default off.", None
    )

    def __post_init__(self) -> None:
        refuse_renamed_mode(self.mode)  # before the Literal's plain refusal
        check_values(self)  # types, choices and ranges first, each error naming its key
        self._check_flow()
        self._check_supported()
        check_server_options(self)  # planner_url: LoRA on, no contradiction
        check_vllm_config(self)  # use_vllm: full fine-tuning on TRL's vLLM generation
        self.per_device_train_batch_size, self.steps_per_generation = resolve_batching(
            self.questions_per_step * int(self.num_generations or 0),
            self.per_device_train_batch_size,
            self.steps_per_generation,
            self.gradient_accumulation_steps,
        )
        if self.mode == "verl_like" and self.delta is None:
            self.delta = VERL_DUAL_CLIP  # verl's dual clip, in TRL's terms
        if self.tools is not None:  # `--tools a,b` as well as `--tools a b`
            self.tools = [t.strip() for item in self.tools for t in item.split(",") if t.strip()]
            if not self.tools:  # an empty list once meant "every tool", python included
                raise ValueError("tools must name at least one tool; leave it unset for all")
        import torch

        self.use_cpu = self.use_cpu or not torch.cuda.is_available()
        if self.bf16 is None:
            self.bf16 = not self.use_cpu and not self.fp16
        super().__post_init__()  # type: ignore[no-untyped-call]

    def _check_flow(self) -> None:
        if self.trajectories and (self.benchmark or self.data):
            raise ValueError(
                "trajectories (offline) and benchmark/data (online) exclude each other; give one"
            )
        if not self.trajectories and bool(self.benchmark) == bool(self.data):
            raise ValueError("give exactly one of benchmark or data (or trajectories)")
        if self.engine == "base" and self.lora is False:
            raise ValueError("engine 'base' is the frozen base under LoRA; it needs lora on")
        for name in ("num_generations", "questions_per_step", "max_turns", "max_steps"):
            if (getattr(self, name) or 0) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")

    def _check_supported(self) -> None:
        if self.loss_type != "dapo":
            raise ValueError(
                f"loss_type={self.loss_type!r}: Flow-GRPO needs loss_type 'dapo'; the weighting "
                "mode ('paper', 'verl_like', 'sequence') sets the normalisation"
            )
        for name, (default, why) in UNSUPPORTED.items():
            if getattr(self, name) != default:
                raise ValueError(f"{name}={getattr(self, name)!r} is not supported yet: {why}")

    def context(self) -> Context:
        """Return the flow's run context: turns, tools and the planner's sampling settings."""
        return context_from(self, max_turns=self.max_turns, tools=self.tools)


def context_from(
    args: GRPOConfig, *, max_turns: int = 3, tools: Sequence[str] | None = None
) -> Context:
    """Return a run context whose planner samples with TRL's `temperature`, `top_p` and length."""
    return Context(
        max_turns=max_turns,
        planner_temperature=args.temperature,
        planner_top_p=args.top_p,
        planner_max_new_tokens=args.max_completion_length or 512,
        tools=tuple(tools) if tools else None,
        query_analysis=getattr(args, "query_analysis", None),
    )


def check_settings(args: GRPOConfig, context: Context, questions: int, *, offline: bool) -> None:
    """Refuse TRL settings the trainer cannot honour, and data smaller than one step."""
    if args.temperature != context.planner_temperature:
        raise ValueError(
            f"TRL temperature {args.temperature} differs from the planner temperature "
            f"{context.planner_temperature}: the logged logprobs would not be the old policy's; "
            "set both to the same value"
        )
    budget = args.max_completion_length  # offline: no rollouts; longer rows are cut, counted
    if not offline and budget is not None and budget != context.planner_max_new_tokens:
        raise ValueError(
            f"max_completion_length {budget} differs from the planner's budget "
            f"(planner_max_new_tokens {context.planner_max_new_tokens}): both are the tokens a "
            "planner turn may have, and a longer turn would be cut before training; set both "
            "to the same value"
        )
    if args.loss_type != "dapo":
        raise ValueError(
            "FlowGRPOTrainer needs loss_type='dapo': the Flow-GRPO weighting "
            "mode ('paper', 'verl_like', 'sequence') sets the normalisation"
        )
    check_trainer_batching(args)
    if args.scale_rewards == "batch" and args.world_size > 1:
        raise ValueError(
            "scale_rewards='batch' under several processes is not supported yet: each "
            "process would divide by its own batch's std; use 'group' or 'none'"
        )
    rollouts = args.per_device_train_batch_size * int(args.steps_per_generation or 1)
    per_step = rollouts // max(int(args.num_generations or 1), 1)
    if questions < per_step:
        raise ValueError(
            f"each step takes {per_step} questions ({rollouts} rollouts per process / "
            f"num_generations {args.num_generations}) but only {questions} "
            f"{'groups' if offline else 'questions'} were given; lower "
            "questions_per_step or give more data"
        )


class FlowParser(TrlParser):
    """TRL's parser of `FlowGRPOConfig` that names unknown keys before building the config."""

    def __init__(self, prog: str = "flowlearn train") -> None:
        """Build the parser; argparse errors raise instead of exiting (`--help` still exits)."""
        types: list[Any] = [FlowGRPOConfig]
        super().__init__(
            types,
            prog=prog,
            exit_on_error=False,
            description="Train the planner with Flow-GRPO: online (rollouts through the flow on "
            "--benchmark/--data) or offline (--trajectories). Settings come from --config "
            "FILE.yaml (any key below) and/or flags (flags win); unknown keys are errors.",
        )
        self.from_file: list[str] = []

    def set_defaults_with_config(self, **kwargs: Any) -> list[str]:
        """Take the YAML values as defaults; keep the unknown ones to report them."""
        self.from_file = list(super().set_defaults_with_config(**kwargs))
        return self.from_file

    def parse_args_into_dataclasses(self, args: Any = None, *rest: Any, **kwargs: Any) -> Any:
        """Refuse unknown keys and flags first, then build the config (TRL's way)."""
        _, extra = self.parse_known_args(args=args)
        unknown = [s for s in self.from_file[::2] + extra if _is_option(s)]
        if unknown:
            raise ValueError(unknown_keys_message(unknown))
        return super().parse_args_into_dataclasses(args, *rest, **kwargs)


def _is_option(text: str) -> bool:
    return text.startswith("-") and not text.lstrip("-")[:1].isdigit()


def unknown_keys_message(options: Sequence[str]) -> str:
    """Say which keys are unknown and, for renamed ones, their name now."""
    names = [option.lstrip("-").split("=")[0].replace("-", "_") for option in options]
    hints = [f"{name} is now {RENAMED[name]}" for name in names if name in RENAMED]
    hints += [f"for {name} use --{name[3:]} false" for name in names if name.startswith("no_")]
    return (
        f"unknown config keys {names}"
        + "".join(f"; {hint}" for hint in hints)
        + "; `flowlearn train --help` lists the known ones"
    )


def parse_config(argv: Sequence[str] = ()) -> FlowGRPOConfig:
    """Parse `--config FILE.yaml` and flags (flags win) into a validated config.

    Raises:
        ValueError: an unknown key, a bad value or contradictory settings.

    """
    argv = list(argv)
    if "--config" in argv[:-1]:  # TRL's parser reads it with yaml.safe_load: check it first
        check_yaml_file(argv[argv.index("--config") + 1])
    try:
        (config,) = FlowParser().parse_args_and_config(argv)
    except argparse.ArgumentError as exc:
        for quoted in str(exc).split("'")[1::2] if exc.argument_name == "--mode" else ():
            refuse_renamed_mode(quoted)  # "invalid choice: 'official' (choose from ...)"
        raise ValueError(str(exc)) from None
    return cast(FlowGRPOConfig, config)


MAX_YAML_BYTES = 1 << 20
"""The largest training config file read: a config is a page of settings, not data."""
MAX_YAML_NODES = 100_000
"""The most values a config may stand for once its aliases are expanded (a YAML alias bomb
stands for billions, and exhausted memory inside TRL's parser)."""


def check_yaml_file(path: str) -> None:
    """Refuse a config file that is too big, expands past `MAX_YAML_NODES`, or repeats a key.

    PyYAML keeps the last of two equal keys and expands aliases without a budget; a repeated
    key is a slip whose first value silently lost, and an alias bomb a denial of service.

    Raises:
        ValueError: naming the file and what is wrong, before TRL's parser reads it.

    """
    import yaml

    try:
        with open(path, "rb") as handle:
            raw = handle.read(MAX_YAML_BYTES + 1)
    except OSError as exc:
        raise ValueError(f"--config {path}: {exc.strerror or exc}") from None
    if len(raw) > MAX_YAML_BYTES:
        raise ValueError(f"--config {path} is larger than {MAX_YAML_BYTES} bytes; is it a config?")
    try:
        root = yaml.compose(raw.decode("utf-8"), Loader=yaml.SafeLoader)
    except (UnicodeDecodeError, yaml.YAMLError) as exc:
        raise ValueError(f"--config {path} is not readable YAML: {exc}") from None
    sizes: dict[int, int] = {}

    def size(node: yaml.Node) -> int:  # aliased nodes are one object: each counted once
        if id(node) not in sizes:
            sizes[id(node)] = 0  # a recursive alias counts as nothing more
            if isinstance(node, yaml.MappingNode):
                keys = [k.value for k, _ in node.value if isinstance(k, yaml.ScalarNode)]
                repeated = sorted({k for k in keys if keys.count(k) > 1})
                if repeated:
                    line = node.start_mark.line + 1
                    raise ValueError(
                        f"--config {path}: the mapping at line {line} gives {repeated} more than "
                        "once; give each key once"
                    )
                children = [part for pair in node.value for part in pair]
            else:
                children = node.value if isinstance(node, yaml.SequenceNode) else []
            sizes[id(node)] = min(1 + sum(size(c) for c in children), MAX_YAML_NODES + 1)
        return sizes[id(node)]

    if root is not None and size(root) > MAX_YAML_NODES:
        raise ValueError(
            f"--config {path} expands to more than {MAX_YAML_NODES} values (YAML aliases); "
            "write the settings out"
        )


_NO = object()
"""Marks a value that does not fit an annotation."""

TRUE, FALSE = ("true", "yes", "on", "1"), ("false", "no", "off", "0")


@dataclass(frozen=True)
class Range:
    """An interval of accepted values; `None` ends are open to infinity."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False

    def holds(self, value: float) -> bool:
        """Say whether `value` lies in the interval."""
        above = self.low is None or (value > self.low if self.low_open else value >= self.low)
        below = self.high is None or (value < self.high if self.high_open else value <= self.high)
        return above and below

    def text(self) -> str:
        """Write the interval as a reader expects it: `> 0`, `in (0, 1]`."""
        low, high = _bound(self.low), _bound(self.high)
        if self.high is None:
            return f"{'>' if self.low_open else '>='} {low}"
        if self.low is None:
            return f"{'<' if self.high_open else '<='} {high}"
        return f"in {'(' if self.low_open else '['}{low}, {high}{')' if self.high_open else ']'}"


def _bound(value: float | None) -> str:
    """Write a bound as a reader expects it: 10000000, not 1e+07."""
    if value is not None and float(value).is_integer() and abs(value) < 1e15:
        return str(int(value))
    return f"{value:g}" if value is not None else ""


POSITIVE, NON_NEGATIVE, AT_LEAST_ONE = Range(0, low_open=True), Range(0), Range(1)
RENAMED = {
    "group_size": "num_generations",
    "planner_temperature": "temperature",
    "planner_top_p": "top_p",
    "planner_max_new_tokens": "max_completion_length",
    "scale": "scale_rewards",
    "device": "use_cpu",
}
"""Old spellings of settings that are now TRL's, named in the unknown-key error."""

UNSUPPORTED: dict[str, tuple[Any, str]] = {
    "generation_batch_size": (None, "it is questions_per_step x num_generations per process"),
    "top_k": (0, "the planner samples with temperature and top_p only"),
    "min_p": (None, "the planner samples with temperature and top_p only"),
    "repetition_penalty": (1.0, "the planner samples with temperature and top_p only"),
    "generation_kwargs": (None, "rollouts sample through the flow, not TRL's generate"),
}
"""TRL options Flow-GRPO training cannot honour yet: their default, and why."""


COUNTS = [
    "num_generations",
    "questions_per_step",
    "max_turns",
    "max_steps",
    "max_completion_length",
    "limit",
    "engine_max_new_tokens",
    "lora_r",
    "lora_alpha",
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "steps_per_generation",
    "generation_batch_size",
    "num_iterations",
]
MOST = {
    "num_generations": 1024,
    "questions_per_step": 100_000,
    "max_turns": MAX_TURNS,
    "max_steps": 10_000_000,
    "max_completion_length": MAX_NEW_TOKENS,
    "limit": 10_000_000,
    "engine_max_new_tokens": MAX_NEW_TOKENS,
    "lora_r": 4096,
    "lora_alpha": 65_536,
    "per_device_train_batch_size": 65_536,
    "gradient_accumulation_steps": 65_536,
    "steps_per_generation": 65_536,
    "generation_batch_size": 1_000_000,
    "num_iterations": 1000,
}
"""The upper bound of each count that runs or allocates: past it a run is a typo or an attack
(`max_steps: 1e26` ran until killed)."""
RANGES: dict[str, Range] = {
    **{name: Range(1, MOST[name]) for name in COUNTS},
    "temperature": Range(0, MAX_TEMPERATURE, low_open=True),
    "top_p": Range(0, 1, low_open=True),
    "logging_steps": POSITIVE,
    "save_steps": POSITIVE,
    **dict.fromkeys(
        [
            "learning_rate",
            "beta",
            "epsilon",
            "epsilon_high",
            "weight_decay",
            "max_grad_norm",
            "adam_epsilon",
            "warmup_steps",
            "format_penalty",
            "step_credit_weight",
            "seed",
            "top_k",
        ],
        NON_NEGATIVE,
    ),
    "step_credit_gamma": Range(0, 1),
    "adam_beta1": Range(0, 1, high_open=True),
    "adam_beta2": Range(0, 1, high_open=True),
    "top_entropy_quantile": Range(0, 1, low_open=True),
}
"""The accepted range of each numeric setting that has one."""

CHOICES: dict[str, tuple[str, ...]] = {
    "scale_rewards": ("group", "batch", "none"),
    "importance_sampling_level": ("token", "sequence"),
    "vllm_mode": ("colocate", "server"),
    "vllm_importance_sampling_mode": (
        "token_truncate",
        "token_mask",
        "sequence_truncate",
        "sequence_mask",
    ),
}
"""Settings that TRL types as `str` but that take one of a few words."""

UNCHECKED = frozenset({"debug"})
"""Fields that transformers' own parser fills outside their annotation (`debug` as None)."""


def check_values(config: Any) -> None:
    """Fit every field of the dataclass `config` to its annotation, then check its range.

    Raises:
        ValueError: a value of the wrong type, choice or range, naming the key and what it
            accepts.

    """
    hints = typing.get_type_hints(type(config))
    for spec in (f for f in dataclasses.fields(config) if f.init and f.name not in UNCHECKED):
        name, value = spec.name, getattr(config, spec.name)
        hint = hints.get(name, Any)
        if name == "scale_rewards" and isinstance(value, bool):
            value = "group" if value else "none"  # TRL's old spelling
        fitted = _fit(value, hint, coerce=False)
        if fitted is _NO:
            fitted = _fit(value, hint, coerce=True)
        if fitted is _NO:
            raise ValueError(f"{name} must be {describe(hint)}, got {value!r}")
        if name in CHOICES and fitted not in CHOICES[name]:
            raise ValueError(f"{name} must be one of {_words(CHOICES[name])}, got {value!r}")
        limits = RANGES.get(name)
        if limits is not None and isinstance(fitted, int | float) and not limits.holds(fitted):
            raise ValueError(f"{name} must be {limits.text()}, got {value!r}")
        if fitted is not value:
            setattr(config, name, fitted)


def _fit(value: Any, hint: Any, *, coerce: bool) -> Any:
    """Return `value` fitted to `hint`, converted when `coerce` allows, or `_NO`."""
    origin = typing.get_origin(hint)
    if hint is Any:
        return value
    if origin in (Union, types.UnionType):
        return _fit_union(value, typing.get_args(hint), coerce=coerce)
    if origin is Literal:
        return value if value in typing.get_args(hint) else _NO
    if hint is type(None):
        return None if value is None else _NO
    if origin is list:
        return _fit_list(value, typing.get_args(hint), coerce=coerce)
    if hint in (bool, int, float, str):
        return _fit_scalar(value, hint, coerce=coerce)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        values = {member.value for member in hint}
        return value if isinstance(value, hint) or value in values else _NO
    if isinstance(origin or hint, type):
        return value if isinstance(value, origin or hint) else _NO
    return value  # an annotation this check does not know: left to the config itself


def _fit_union(value: Any, members: tuple[Any, ...], *, coerce: bool) -> Any:
    enums = [m for m in members if isinstance(m, type) and issubclass(m, enum.Enum)]
    if enums and isinstance(value, str):  # `IntervalStrategy | str`: the string names a member
        members = tuple(enums)
    for member in members:
        fitted = _fit(value, member, coerce=coerce)
        if fitted is not _NO:
            return fitted
    return _NO


def _fit_list(value: Any, args: tuple[Any, ...], *, coerce: bool) -> Any:
    item = args[0] if args else Any
    if isinstance(value, str) and coerce:
        value = [value]  # `tools: python` means a list of one
    if not isinstance(value, list | tuple):
        return _NO
    fitted = [_fit(v, item, coerce=coerce) for v in value]
    return _NO if any(f is _NO for f in fitted) else fitted


def _fit_scalar(value: Any, kind: type, *, coerce: bool) -> Any:
    if kind is bool:
        if isinstance(value, bool) or not (coerce and isinstance(value, str)):
            return value if isinstance(value, bool) else _NO
        word = value.strip().lower()
        return True if word in TRUE else False if word in FALSE else _NO
    if kind is str:
        return value if isinstance(value, str) else _NO
    if isinstance(value, bool):
        return _NO  # `temperature: true` is a slip, not 1.0
    if coerce and isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            return _NO
    if not isinstance(value, int | float) or not math.isfinite(value):
        return _NO
    if kind is float:
        return float(value)
    if isinstance(value, int):
        return value
    return int(value) if coerce and float(value).is_integer() else _NO


def describe(hint: Any) -> str:
    """Say in words what an annotation accepts, for error messages."""
    origin = typing.get_origin(hint)
    if origin in (Union, types.UnionType):
        members = typing.get_args(hint)
        if any(isinstance(m, type) and issubclass(m, enum.Enum) for m in members):
            members = tuple(m for m in members if m is not str)  # the string names a member
        return " or ".join(dict.fromkeys(describe(m) for m in members))
    if origin is Literal:
        return f"one of {_words(typing.get_args(hint))}"
    if origin is list:
        args = typing.get_args(hint)
        return f"a list of ({describe(args[0])})" if args else "a list"
    words = {bool: "true or false", int: "a whole number", float: "a finite number"}
    if hint in words:
        return words[hint]
    if hint is type(None):
        return "null"
    if hint is str:
        return "a string"
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return f"one of {_words(tuple(m.value for m in hint))}"
    return getattr(hint, "__name__", str(hint))


def _words(values: tuple[Any, ...]) -> str:
    return ", ".join(repr(v) for v in values)
