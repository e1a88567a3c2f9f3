"""The training config: TRL's `GRPOConfig` plus the flow's fields, parsed by TRL's `TrlParser`.

Why it looks like this:
1. The config IS a `GRPOConfig`, so every TRL and transformers option is reachable from YAML
   and from `flowlearn train`; the flow adds only what TRL has no knob for.
2. Where the flow and TRL share a knob it is declared once, by TRL: `num_generations` is G,
   `temperature`, `top_p` and `max_completion_length` are the planner's sampling (`context()`
   builds the run context from them), `scale_rewards` is the advantage scaling. Their
   defaults, and those of the run context's other fields here (`max_turns`, `tools`,
   `query_analysis`), are `TRAINING_CONTEXT`'s, the one declaration `flowlearn collect` reads
   too; the names of models, tools and sandbox are the composition root's `FlowSpec` fields.
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
from collections.abc import Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Literal, cast

from trl.scripts.utils import TrlParser
from trl.trainer.grpo_config import GRPOConfig

from flowlearn.config_keys import unknown_keys_message
from flowlearn.nodes.schema.context import TRAINING_CONTEXT, Context
from flowlearn.nodes.tools.python_sandbox import Isolation
from flowlearn.training.batches import VERL_DUAL_CLIP, check_trainer_batching, resolve_batching
from flowlearn.training.config_checks import UNSUPPORTED, check_values, check_yaml_file
from flowlearn.training.roles import (
    NodeSettings,
    check_train_nodes,
    parse_node_settings,
    several_roles,
)
from flowlearn.training.rows import Mode, StepCredit, refuse_renamed_mode
from flowlearn.training.vllm.settings import check_server_options, check_vllm_config


def _help(text: str, default: Any, **extra: Any) -> Any:
    return field(default=default, metadata={"help": text, **extra})


_CONTEXT_FIELDS = {f.name: f for f in fields(Context)}


def _described(name: str) -> str:
    """Return the description of `Context.<name>`, the help of the config field that is it.

    Such a field's default is `TRAINING_CONTEXT`'s (the context of rollouts to train on), so
    the config, the run context it builds and `flowlearn collect` cannot drift apart.
    """
    return str(_CONTEXT_FIELDS[name].metadata["description"])


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
    max_turns: int = _help(_described("max_turns"), TRAINING_CONTEXT.max_turns)
    rollout_concurrency: int | None = _help(
        "Rollouts in flight at once per process; their planner and engine calls decode "
        "together in batches of up to as many. Default: the step's rollouts, "
        "questions_per_step x num_generations (TRL's generation batch); lower it to cap the "
        "KV cache's memory.",
        None,
    )
    tools: list[str] | None = field(default=None, metadata={"help": _described("tools")})
    corpus: str | None = _help("JSONL corpus for local_search.", None)
    web: bool = _help(
        "Bind wikipedia_search and web_search too (web_search needs $TAVILY_API_KEY), as "
        "`flowlearn run --web` does.",
        False,
        **FLAG,
    )
    wikipedia_endpoint: str | None = _help(
        "The MediaWiki API URL wikipedia_search calls; default: English Wikipedia.", None
    )
    python_isolation: Isolation = field(
        default="bwrap",
        metadata={
            "help": "How the python tool runs model-written code: 'bwrap' (the Linux sandbox, "
            "refused where the host cannot build it) or 'none' (unisolated, with your user's "
            "rights: an explicit opt-in)."
        },
    )
    # Trained roles (flowlearn.training.roles)
    train_nodes: list[str] = field(
        default_factory=lambda: ["planner"],
        metadata={
            "help": "Nodes whose policy calls are trained: planner, verifier, executor, or a "
            "custom node that calls the policy. More than the planner alone: one LoRA adapter "
            "per node on one base model (lora on); the others run on the base with every "
            "adapter off."
        },
    )
    node_settings: dict[str, Any] | str | None = field(
        default=None,
        metadata={
            "help": "Per trained node, its own settings: learning_rate (any node), top_p and "
            "max_new_tokens (the verifier and executor), e.g. "
            '{"verifier": {"learning_rate": 1e-4}} (YAML mapping or JSON); unset: the run\'s.'
        },
    )
    node_weighting: Literal["node", "pooled"] = _help(
        "With several trained nodes: 'node' gives each node the paper's objective over its own "
        "turns (the planner's rows weigh as when it trains alone); 'pooled' weighs a "
        "trajectory's turns of every trained node together.",
        "node",
    )
    query_analysis: bool | None = _help(
        _described("query_analysis"), TRAINING_CONTEXT.query_analysis, **FLAG
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
    format_penalty: float = _help(
        "Penalty weight for the share of the trained nodes' calls that did not parse.", 0.0
    )
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
    # Asynchronous rollouts (flowlearn.training.producer)
    max_staleness: int = _help(
        "Roll out the next steps while the trainer updates, sampling with weights at most this "
        "many updates old (1: one-step off-policy); 0: the synchronous loop. Stale rows are "
        "importance-corrected (stale_importance_cap).",
        0,
    )
    stale_importance_cap: float = _help(
        "Under max_staleness: each stale token's weight, pi_now / pi_sampler, is truncated at "
        "this cap (verl's tis_imp_ratio_cap).",
        2.0,
    )
    producer_stall_s: float = _help(
        "Under max_staleness: seconds the trainer waits for a step's rollouts before it stops "
        "the run, reporting the producer stalled.",
        600.0,
    )
    # The planner on a vLLM server (flowlearn.training.vllm.lora_server)
    planner_url: str | None = _help(
        "Sample the planner on a vLLM server at this base URL (http://HOST:PORT/v1) with "
        "runtime LoRA loading; needs lora. Each step's adapter is loaded into it "
        "(/v1/load_lora_adapter) as flow-RUNID-stepK, the rollouts' model and policy_version; "
        "with several train_nodes each node's as flow-RUNID-stepK-NODE, the nodes not trained "
        "on the served base.",
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
    temperature: float = _help(
        "Planner sampling temperature, of rollouts and of TRL.",
        TRAINING_CONTEXT.planner_temperature,
    )
    max_completion_length: int | None = _help(
        "Planner tokens per turn (paper: 2048).", TRAINING_CONTEXT.planner_max_new_tokens
    )
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
    verbose: bool = _help(
        "Print TRL's whole metrics dict each logging step instead of one line (step, reward, "
        "accuracy, KL, seconds); metrics.jsonl holds every metric either way. As a flag, "
        "also shows the libraries' loading bars and warnings.",
        False,
        **FLAG,
    )
    dry_run: bool = _help(
        "Validate the config, print the rollouts and tokens per step, an estimate of the GPU "
        "memory per device and the files the run writes, then stop: no weights load, nothing "
        "is written (flowlearn.training.dry_run).",
        False,
        **FLAG,
    )
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
        if self.benchmark and self.data:
            raise ValueError("give one of benchmark or data (or trajectories), not both")
        if self.engine == "base" and self.lora is False:
            raise ValueError("engine 'base' is the frozen base under LoRA; it needs lora on")
        self._check_roles()
        for name in ("num_generations", "questions_per_step", "max_turns", "max_steps"):
            if (getattr(self, name) or 0) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")

    def _check_roles(self) -> None:
        self.train_nodes = check_train_nodes(
            [n for item in self.train_nodes for n in str(item).split(",") if n.strip()]
            if isinstance(self.train_nodes, list)
            else self.train_nodes
        )
        self.node_roles()  # refuses unknown nodes, keys and values now
        if not several_roles(self.train_nodes):
            return
        if self.lora is False:
            raise ValueError(
                f"train_nodes {self.train_nodes}: full fine-tuning of several nodes (or of a node "
                "other than the planner) is refused: it would hold a copy of the model per node. "
                "Set lora on (the default for several nodes): one adapter per node on one base"
            )
        self.lora = True
        if self.use_vllm:
            raise ValueError(
                f"use_vllm with train_nodes {self.train_nodes} is not supported yet: TRL's vLLM "
                "engine syncs one model's weights, not an adapter per node; train several nodes "
                "with local rollouts, or on your vLLM server with planner_url (each node's "
                "adapter pushed to it)"
            )
        if self.planner_url:  # each node's adapter on the server, sampled at TRL's top_p
            for node, settings in self.node_roles().items():
                if settings.top_p is not None and settings.top_p < 1:
                    raise ValueError(
                        f"node_settings[{node!r}]['top_p'] {settings.top_p} with planner_url: "
                        "the server's processed logprobs are renormalised over the top-p "
                        "nucleus, while the trainer scores the full distribution; leave the "
                        "node's top_p unset or 1"
                    )
        if self.ddp_find_unused_parameters is None:  # a micro-batch reaches one adapter
            self.ddp_find_unused_parameters = True

    def node_roles(self) -> dict[str, NodeSettings]:
        """Return each trained node's own settings (`node_settings`), checked."""
        return parse_node_settings(self.node_settings, self.train_nodes)

    def check_questions_named(self) -> None:
        """Refuse a config that names no questions, where nothing else gives them (the CLI).

        In Python, `FlowGRPOTrainer(..., train_dataset=...)` gives them instead.
        """
        if not (self.trajectories or self.benchmark or self.data):
            raise ValueError(
                "give one of benchmark or data (or trajectories): the questions to train on"
            )

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
    args: GRPOConfig,
    *,
    max_turns: int = TRAINING_CONTEXT.max_turns,
    tools: Sequence[str] | None = None,
) -> Context:
    """Return a run context whose planner samples with TRL's `temperature`, `top_p` and length.

    Every other setting is `TRAINING_CONTEXT`'s (a TRL length of None: its budget). TRL's
    `seed` seeds the rollouts too: every sampled planner call draws from a seed derived from
    it, the step, the rollout, the question and the turn (`Rollouts.run`), so a run repeats
    with its seed and a resumed step draws as it first did.
    """
    return replace(
        TRAINING_CONTEXT,
        max_turns=max_turns,
        planner_temperature=args.temperature,
        planner_top_p=args.top_p,
        planner_max_new_tokens=args.max_completion_length
        or TRAINING_CONTEXT.planner_max_new_tokens,
        tools=tuple(tools) if tools else None,
        query_analysis=getattr(args, "query_analysis", None),
        seed=args.seed,
    )


def flow_defaults(
    args: GRPOConfig,
    context: Context | None,
    mode: Mode | None,
    drop_zero_variance: bool | None,
    step_credit: StepCredit | None,
    recompute_old_logprobs: bool | None = None,
) -> tuple[Context | None, Mode, bool, StepCredit | None, bool]:
    """Fill the trainer's flow settings not given from a `FlowGRPOConfig` (else the paper's)."""
    if isinstance(args, FlowGRPOConfig):
        if recompute_old_logprobs is None:
            recompute_old_logprobs = args.recompute_old_logprobs
        context = context or args.context()
        mode = mode or args.mode
        if drop_zero_variance is None:
            drop_zero_variance = args.drop_zero_variance
        if step_credit is None and args.step_credit_weight:
            step_credit = StepCredit(args.step_credit_weight, args.step_credit_gamma)
    recompute = bool(recompute_old_logprobs)
    return context, mode or "paper", bool(drop_zero_variance), step_credit, recompute


def check_settings(args: GRPOConfig, context: Context, questions: int, *, offline: bool) -> None:
    """Refuse TRL settings the trainer cannot honour, and data smaller than one step."""
    staleness = getattr(args, "max_staleness", 0)
    if not isinstance(staleness, int) or isinstance(staleness, bool) or staleness < 0:
        raise ValueError(f"max_staleness must be a whole number >= 0, got {staleness!r}")
    cap = getattr(args, "stale_importance_cap", 2.0)
    if not cap > 0:
        raise ValueError(f"stale_importance_cap must be > 0, got {cap!r}")
    stall = getattr(args, "producer_stall_s", 600.0)
    if not stall > 0:
        raise ValueError(f"producer_stall_s must be > 0 seconds, got {stall!r}")
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
    if "--config" in argv[:-1]:
        resolve_file_paths(config, Path(argv[argv.index("--config") + 1]), argv)
    for key in CONFIG_RELATIVE:  # `flowlearn:...`: a file shipped in the package
        value = getattr(config, key)
        if isinstance(value, str) and value.startswith(SHIPPED):
            setattr(config, key, shipped_file(value))
    return cast(FlowGRPOConfig, config)


CONFIG_RELATIVE = ("data", "corpus", "trajectories")
"""Config keys naming files: in a config file, relative to that file (as a flag, to the
working directory), so a config runs the same from any folder; or `flowlearn:PATH`, a file
shipped in the package (`shipped_file`), so a recipe copied anywhere still finds its data."""
SHIPPED = "flowlearn:"


def shipped_file(value: str) -> str:
    """Return the path of `flowlearn:SUBPACKAGE/PATH`, a file shipped in the package.

    `flowlearn:evals/data/tooluse/train.jsonl` is the tool task's training split wherever
    flowlearn is installed (an editable install keeps subpackages in other folders, so the
    first part names a subpackage, found through the import system).

    Raises:
        ValueError: no such subpackage or file, naming what was asked.

    """
    from importlib.resources import files

    package, _, rest = value.removeprefix(SHIPPED).partition("/")
    try:
        path = Path(str(files(f"flowlearn.{package}").joinpath(rest)))
    except (ImportError, TypeError, ValueError):
        path = None
    if not package or not rest or path is None or not path.is_file():
        raise ValueError(
            f"{value} is no file shipped with flowlearn; give e.g. "
            "flowlearn:evals/data/tooluse/train.jsonl, or a path"
        )
    return str(path)


def resolve_file_paths(config: Any, path: Path, argv: Sequence[str]) -> None:
    """Resolve each `CONFIG_RELATIVE` value the config file gave against the file's folder."""
    import yaml

    loaded = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    for key in CONFIG_RELATIVE:
        spellings = {f"--{key}", f"--{key.replace('_', '-')}"}
        flagged = any(a in spellings or a.split("=")[0] in spellings for a in argv)
        value = getattr(config, key)
        shipped = str(value).startswith(SHIPPED)
        if flagged or key not in loaded or not value or shipped or Path(str(value)).is_absolute():
            continue
        setattr(config, key, str(path.parent / str(value)))
