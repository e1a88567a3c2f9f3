"""A training config's values checked: the file it is read from, and each value by its field.

`check_yaml_file` refuses a file that is too big, expands past a budget (a YAML alias bomb) or
repeats a key, before TRL's parser reads it. `check_values` fits every field's value to its
annotation (type, choice and range, the key named): YAML values reach the config as argparse
defaults, which argparse does not check (`mode: bogus` passes), and PyYAML reads `1e-6` as a
string.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import types
import typing
from dataclasses import dataclass
from typing import Any, Literal, Union

from flowlearn.engine.sampling import MAX_NEW_TOKENS, MAX_TEMPERATURE
from flowlearn.files import read_capped
from flowlearn.nodes.schema.context import MAX_TURNS

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
        raw = read_capped(path, MAX_YAML_BYTES)
    except OSError as exc:
        raise ValueError(f"--config {path}: {exc.strerror or exc}") from None
    if raw is None:
        raise ValueError(f"--config {path} is larger than {MAX_YAML_BYTES} bytes; is it a config?")
    try:
        root = yaml.compose(raw.decode("utf-8"), Loader=yaml.SafeLoader)
    except (UnicodeDecodeError, yaml.YAMLError) as exc:
        raise ValueError(f"--config {path} is not readable YAML: {exc}") from None
    sizes: dict[int, int] = {}

    def size(node: yaml.Node) -> int:  # aliased nodes are one object: each counted once
        if id(node) not in sizes:
            sizes[id(node)] = 0  # a recursive alias counts as nothing more
            refuse_yaml_node(node, path)
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
    try:  # what TRL's parser then does, bounded now; any other construction error named here
        yaml.safe_load(raw.decode("utf-8"))
    except (yaml.YAMLError, RecursionError) as exc:
        raise ValueError(f"--config {path} is not a settings file: {exc}") from None


def refuse_yaml_node(node: Any, path: str) -> None:
    """Refuse a tag the safe loader does not build (`!!python/...`), or a key that is no scalar.

    Raises:
        ValueError: naming the file, the line and the fix.

    """
    import yaml

    line = node.start_mark.line + 1
    merging = ("tag:yaml.org,2002:merge", "tag:yaml.org,2002:value")  # `<<: *base` is fine
    if node.tag not in yaml.SafeLoader.yaml_constructors and node.tag not in merging:
        raise ValueError(
            f"--config {path}: line {line} has the tag {node.tag.split(':', 2)[-1]!r}; a "
            "config holds plain values (strings, numbers, booleans, lists, mappings): remove "
            "the tag"
        )
    if isinstance(node, yaml.MappingNode):
        for key, _ in node.value:
            if not isinstance(key, yaml.ScalarNode):
                raise ValueError(
                    f"--config {path}: line {key.start_mark.line + 1} has a key that is a "
                    "list or mapping (a YAML complex key, `? ...`); keys are setting names: "
                    "write `name: value`"
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


POSITIVE, NON_NEGATIVE = Range(0, low_open=True), Range(0)

ROLLOUT_DECODER = (
    "the flow's calls decode in its own continuous batcher (flowlearn.engine.BatchingPolicy: "
    "calls join a running decode, adapters mix in one batch, logprobs are kept exactly), "
    "which TRL's generate settings do not reach; for a faster engine set use_vllm"
)
UNSUPPORTED: dict[str, tuple[Any, str]] = {
    "generation_batch_size": (None, "it is questions_per_step x num_generations per process"),
    "top_k": (0, "the planner samples with temperature and top_p only"),
    "min_p": (None, "the planner samples with temperature and top_p only"),
    "repetition_penalty": (1.0, "the planner samples with temperature and top_p only"),
    "generation_kwargs": (None, "rollouts sample through the flow, not TRL's generate"),
    "cache_implementation": (None, ROLLOUT_DECODER),
    "use_transformers_continuous_batching": (False, ROLLOUT_DECODER),
    "transformers_continuous_batching_config": (None, ROLLOUT_DECODER),
    "use_transformers_paged": (False, ROLLOUT_DECODER),  # TRL's old name of the one above
    "chat_template_kwargs": (
        None,
        "the flow's nodes render their own prompts with the chat template as it is",
    ),
    "max_tool_calling_iterations": (None, "the flow's tool loop is its own: set max_turns"),
    "multi_objective_aggregation": (
        "sum_then_normalize",
        "the reward functions' weighted sum is normalised within each group ('sum_then_normalize')",
    ),
    "log_completions": (
        False,
        "flowlearn train keeps every rollout, tokens and reward, in <output_dir>/rollouts.jsonl",
    ),
    "trust_remote_code": (False, "models load with the code transformers ships only"),
    "num_generations_eval": (
        None,
        "the trainer does not evaluate; run flowlearn eval on a checkpoint",
    ),
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
    "rollout_concurrency",
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
    "rollout_concurrency": 100_000,
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
