"""Trained roles: the nodes whose calls are trained, each its own LoRA adapter on one base.

Why it is built this way:
1. A flow has several policies worth training (a planner that picks tools, a verifier that
   learns when to stop); training them as separate models would hold the base once per role.
   Each trained node gets a named PEFT adapter on the one base (`with_node_adapters`), the
   untrained ones and the fixed engine run on the base with every adapter off.
2. One outcome trains them all: the trajectory's reward is broadcast to every turn of every
   trained node, and the advantages are normalised within each node's group of rollouts.
   `node` weighting (the default) gives each node the paper's objective of its own turns (1/Q,
   1/G, 1/T_i over that node's turns, 1/|a|), summed over the nodes, so the planner's rows
   weigh exactly as when it trains alone and each adapter learns as if trained by itself.
   `pooled` weighs a trajectory's turns of every trained node together as its T_i.
3. One optimizer updates every adapter; each micro-batch runs under its rows' node's adapter,
   so a row's gradient reaches only that adapter. A node may have its own learning rate (an
   optimizer group of its own), top-p and token budget; all sample at TRL's one temperature,
   since TRL's forward scores every row with the temperature fused into its LM head.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from flowlearn.engine.adapters import (
    NodePolicies,
    NodeSampling,
    adapter_names,
    check_node_name,
    node_policies,
)
from flowlearn.engine.local import HFPolicy
from flowlearn.engine.sampling import MAX_NEW_TOKENS
from flowlearn.engine.tokens import ModelHandle
from flowlearn.errors import brief
from flowlearn.training.rows import FlowGRPOBatch, Mode, build_flow_grpo_rows
from flowlearn.training.trajectories import Trajectory

NODE_WEIGHTINGS = ("node", "pooled")
SAMPLING_NODES = ("verifier", "executor")
"""Nodes whose top-p and token budget `node_settings` may set: the planner's are TRL's own
(`top_p`, `max_completion_length`), and a custom node samples as its own code says."""


@dataclass(frozen=True)
class NodeSettings:
    """One trained node's own settings; None: the run's."""

    learning_rate: float | None = None
    """This node's adapter's learning rate; None: TRL's `learning_rate`."""
    top_p: float | None = None
    """This node's top-p; None: the run's (TRL's `top_p`)."""
    max_new_tokens: int | None = None
    """This node's tokens per call; None: its prompt set's budget."""


MAX_TRAIN_NODES = 64
"""The most nodes one run trains: one adapter each on the one base, in one optimizer."""


def several_roles(train_nodes: Sequence[str]) -> bool:
    """Say whether `train_nodes` asks for node adapters: anything but the planner alone."""
    return list(train_nodes) != ["planner"]


def check_train_nodes(train_nodes: object) -> list[str]:
    """Return `train_nodes` as a list of distinct node names, or raise naming the problem.

    Raises:
        ValueError: not a non-empty list of at most `MAX_TRAIN_NODES` distinct node names;
            the names listed in the message are bounded (`brief`).

    """
    if isinstance(train_nodes, str):
        train_nodes = [n.strip() for n in train_nodes.split(",") if n.strip()]
    if not isinstance(train_nodes, list | tuple) or not train_nodes:
        raise ValueError(
            f"train_nodes must name at least one node whose calls are trained, e.g. [planner, "
            f"verifier]; got {str(train_nodes)[:200]}"
        )
    if len(train_nodes) > MAX_TRAIN_NODES:
        raise ValueError(
            f"train_nodes names {len(train_nodes):,} nodes ({brief(train_nodes)}); at most "
            f"{MAX_TRAIN_NODES} can train, each with an adapter of its own"
        )
    names = [check_node_name(n) for n in train_nodes]
    twice = [n for n, k in Counter(names).items() if k > 1]
    if twice:
        raise ValueError(f"train_nodes names {brief(twice)} more than once; name each node once")
    return names


def parse_node_settings(value: object, train_nodes: Sequence[str]) -> dict[str, NodeSettings]:
    """Read `node_settings` (a mapping, or its JSON) into each trained node's settings.

    Raises:
        ValueError: not a mapping, a node that is not trained, an unknown key, a value out of
            range, or a sampling setting for a node whose sampling is not its own.

    """
    if value is None or value == "":
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise ValueError(f"node_settings is not a JSON mapping: {exc}") from None
    if not isinstance(value, Mapping):
        raise ValueError(
            "node_settings must map trained nodes to their settings, e.g. "
            f'{{"verifier": {{"learning_rate": 1e-4}}}}; got {value!r}'
        )
    known = [f.name for f in fields(NodeSettings)]
    out: dict[str, NodeSettings] = {}
    for node, settings in value.items():
        if node not in train_nodes:
            raise ValueError(
                f"node_settings names {node!r}, which is not in train_nodes {list(train_nodes)}"
            )
        if not isinstance(settings, Mapping):
            raise ValueError(f"node_settings[{node!r}] must be a mapping of {known}")
        unknown = sorted(set(settings) - set(known))
        if unknown:
            raise ValueError(f"node_settings[{node!r}] has unknown keys {unknown}; known: {known}")
        sampled = sorted(k for k in ("top_p", "max_new_tokens") if settings.get(k) is not None)
        if sampled and node not in SAMPLING_NODES:
            raise ValueError(
                f"node_settings[{node!r}] sets {sampled}, but the {node}'s sampling is not its "
                "own here: the planner's is TRL's top_p and max_completion_length, a custom "
                "node's is what its code asks for"
            )
        out[node] = NodeSettings(**{k: _checked(node, k, settings[k]) for k in settings})
    return out


def _checked(node: str, key: str, value: Any) -> Any:
    """Return one node setting as a number in its range, else raise naming it."""
    where = f"node_settings[{node!r}][{key!r}]"
    if value is None:
        return None
    try:
        number = float(value) if key != "max_new_tokens" else int(value)
    except (TypeError, ValueError):
        raise ValueError(f"{where} must be a number, got {value!r}") from None
    if key == "max_new_tokens" and not 1 <= int(number) <= MAX_NEW_TOKENS:
        raise ValueError(f"{where} must be in [1, {MAX_NEW_TOKENS}], got {value!r}")
    if key == "top_p" and not 0 < number <= 1:
        raise ValueError(f"{where} must be in (0, 1], got {value!r}")
    if key == "learning_rate" and not (0 < number < 1):
        raise ValueError(f"{where} must be in (0, 1), got {value!r}")
    return number


def lora_settings(config: Any) -> Any:
    """Return the `LoraConfig` of a node's adapter from a training config."""
    from peft import LoraConfig

    return LoraConfig(
        r=config.lora_r,
        lora_alpha=config.lora_alpha,
        target_modules="all-linear",
        task_type="CAUSAL_LM",
    )


def with_node_adapters(model: Any, adapters: Mapping[str, Any]) -> Any:
    """Give `model` one LoRA adapter per node, named after it, every one of them trainable.

    Args:
        model: the base causal LM (not yet a PEFT model).
        adapters: from node name to its `peft.LoraConfig`, e.g. `{"planner": LoraConfig(r=16),
            "verifier": LoraConfig(r=8)}`.

    Returns the PEFT model. PEFT leaves only the active adapter trainable; one optimizer
    trains them all, so every adapter's weights are made trainable here.

    Raises:
        ValueError: no adapters, a bad node name, or a model that already carries adapters.

    """
    from peft import get_peft_model

    if not adapters:
        raise ValueError("give at least one node's adapter, e.g. {'planner': LoraConfig(...)}")
    if adapter_names(model):
        raise ValueError(
            "the model already carries adapters: give the base model, each node gets its own"
        )
    (first, settings), *rest = adapters.items()
    peft_model = get_peft_model(model, settings, adapter_name=check_node_name(first))
    for node, node_settings in rest:
        peft_model.add_adapter(check_node_name(node), node_settings)
    for name, parameter in peft_model.named_parameters():
        if "lora_" in name:
            parameter.requires_grad_(True)
    return peft_model


def node_parameters(model: Any, node: str) -> list[Any]:
    """Return the weights of `node`'s adapter on `model`."""
    return [p for n, p in model.named_parameters() if "lora_" in n and f".{node}." in n]


def node_learning_rates(optimizer: Any, model: Any, rates: Mapping[str, float]) -> Any:
    """Return `optimizer` regrouped: each node's adapter in groups at its own learning rate.

    The optimizer's groups (weight decay or not) are each split by node; a node with a rate
    gets it, the others keep the group's. The scheduler built afterwards scales each group.
    """
    if not rates:
        return optimizer
    owner = {id(p): node for node in rates for p in node_parameters(model, node)}
    groups: list[dict[str, Any]] = []
    for group in optimizer.param_groups:
        split: dict[str | None, list[Any]] = {}
        for parameter in group["params"]:
            split.setdefault(owner.get(id(parameter)), []).append(parameter)
        for node, parameters in split.items():
            groups.append({**group, "params": parameters, **({"lr": rates[node]} if node else {})})
    optimizer.param_groups = []  # regrouped in place: nothing is stepped yet, no state to move
    for group in groups:
        optimizer.add_param_group(group)
    return optimizer


@dataclass(frozen=True)
class TrainedRoles:
    """Which nodes a trainer trains, how their rows weigh, and each one's own settings."""

    nodes: tuple[str, ...] = ("planner",)
    """The trained nodes, in order; their index is the row's `flow_node`."""
    adapters: bool = False
    """Whether each trained node has its own adapter (anything but the planner alone)."""
    weighting: str = "node"
    """`node` or `pooled` (see the module docstring)."""
    settings: Mapping[str, NodeSettings] | None = None
    """Each node's own settings; a node not named uses the run's."""

    @classmethod
    def of(cls, args: Any, model: Any, rows_from: Sequence[str] | None) -> TrainedRoles | None:
        """Read the trained roles and check `model` carries an adapter for each.

        They come from `args.train_nodes` (a `FlowGRPOConfig`), or in Python from the
        trainer's `nodes` when `model` carries an adapter named after each of them. None when
        only the planner trains (no adapters of its own), or `nodes` name rows of one shared
        model: the rows then come from `rows_from` as before.

        Raises:
            ValueError: a configured node without its adapter on `model`, or `nodes` that
                disagree with `train_nodes` or name a node twice.

        """
        configured = list(getattr(args, "train_nodes", None) or [])
        twice = [n for n, k in Counter(rows_from or ()).items() if k > 1]
        if twice:  # the trainer's `nodes`: each once, as `train_nodes`
            raise ValueError(f"nodes names {brief(twice)} more than once; name each node once")
        if configured and several_roles(configured):
            nodes = configured
            if rows_from is not None and sorted(rows_from) != sorted(nodes):
                raise ValueError(f"nodes {brief(rows_from)} differ from train_nodes {nodes}")
        elif rows_from and several_roles(rows_from) and set(rows_from) <= set(adapter_names(model)):
            nodes = list(rows_from)
        else:
            return None
        missing = [n for n in nodes if n not in adapter_names(model)]
        if missing:
            raise ValueError(
                f"train_nodes {nodes}: the model has no adapter for {missing} (it has "
                f"{adapter_names(model)}); give the base wrapped by "
                "`flowlearn.training.roles.with_node_adapters(model, {node: LoraConfig(...)})`"
            )
        settings = args.node_roles() if hasattr(args, "node_roles") else {}
        weighting = str(getattr(args, "node_weighting", "node"))
        return cls(tuple(nodes), True, weighting, settings)

    def own(self, node: str) -> NodeSettings:
        """Return `node`'s own settings (all None where it has none)."""
        return (self.settings or {}).get(node) or NodeSettings()

    def learning_rates(self) -> dict[str, float]:
        """Return the nodes that have a learning rate of their own, and it."""
        return {n: s.learning_rate for n, s in (self.settings or {}).items() if s.learning_rate}


def role_rows(
    trajectories: Sequence[Trajectory], roles: TrainedRoles, mode: Mode, **options: Any
) -> tuple[FlowGRPOBatch, dict[str, dict[str, Any]]]:
    """Build the step's rows for every trained node, and each node's own statistics.

    Under `node` weighting each node's rows are built alone (its own advantages' groups and
    Eq. 10 weights, as if it trained by itself) and put together; under `pooled` once, over
    the turns of every trained node. The batch's statistics are the pooled build's.
    """
    pooled = build_flow_grpo_rows(trajectories, mode, nodes=roles.nodes, **options)
    per_node = {
        node: build_flow_grpo_rows(trajectories, mode, nodes=[node], **options)
        for node in roles.nodes
    }
    stats = {node: batch.stats for node, batch in per_node.items()}
    if roles.weighting == "pooled":
        return pooled, stats
    rows = [row for batch in per_node.values() for row in batch.rows]
    return FlowGRPOBatch(rows, pooled.stats), stats


def load_node_checkpoint(model: Any, folder: Path, nodes: Sequence[str]) -> None:
    """Load each node's adapter weights from a checkpoint's `<node>/` folder into `model`.

    PEFT saves a named adapter in a folder of its name; transformers' own resume looks for one
    adapter at the checkpoint's top and would find none.

    Raises:
        ValueError: a node whose adapter weights the checkpoint does not hold.

    """
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    for node in nodes:
        weights = folder / node / "adapter_model.safetensors"
        if not weights.is_file():
            raise ValueError(
                f"checkpoint {folder} holds no adapter for the {node} node ({weights} is "
                "missing): it was not saved by a run training these nodes"
            )
        result = set_peft_model_state_dict(model, load_file(str(weights)), adapter_name=node)
        unexpected = list(getattr(result, "unexpected_keys", []) or [])
        if unexpected:
            raise ValueError(
                f"checkpoint {folder}/{node} does not fit the {node} adapter: unexpected "
                f"weights {unexpected[:3]}"
            )


def own_sampling(nodes: NodePolicies, roles: TrainedRoles) -> NodePolicies:
    """Give each trained node its own top-p and token budget (`NodeSampling`)."""
    tuned = {
        n: NodeSampling(p, roles.own(n).top_p, roles.own(n).max_new_tokens)
        for n, p in nodes.items()
    }
    return NodePolicies(tuned, nodes.base)


def sampled_by_role(policy: Any, roles: TrainedRoles | None) -> Any:
    """Return `policy` as rollouts sample it.

    With several trained nodes each node gets its own top-p and token budget (`own_sampling`);
    one trained policy stays as it is.
    """
    return policy if roles is None else own_sampling(policy, roles)


def local_policy(handle: ModelHandle, version: str, roles: TrainedRoles | None) -> Any:
    """Return the trained model's policy on `handle`, versioned `version`.

    With several trained nodes it is a `NodePolicies`: each node under its own adapter, with
    its own sampling, and the others on the base (every adapter off).
    """
    policy = HFPolicy.on(handle, version=version)
    if roles is None:
        return policy
    return own_sampling(node_policies(policy, roles.nodes), roles)
