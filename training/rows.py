"""Flow-GRPO rows: rewarded trajectories checked, grouped, given advantages and loss weights.

Why it looks like this:
1. The outcome reward of a whole trajectory is the only signal; every planner turn of
   trajectory i gets the same group-normalised advantage A_i (the broadcast, paper Eq. 7).
2. Turns are trained as separate samples with their own exact prompt and completion ids, so a
   multi-turn rollout never has to be re-tokenised into one sequence.
3. `token_weight` carries the loss normalisation of each mode, so the trainer only has to sum
   token_weight * per-token objective. `paper` (Eq. 7 and 10) normalises the outcome rewards
   within a question's G trajectories and weighs each question 1/Q, each of its G trajectories
   1/G, each of a trajectory's T_i turns 1/T_i and each of a turn's |a| tokens 1/|a|, so a long
   trajectory never outweighs a short one; `sequence` averages each row's tokens, then the rows.
4. `verl_like` is the arithmetic of the official code, verl v0.5.0: `compute_grpo_outcome_
   advantage` over a question's turn-samples pooled, with the unbiased std and its singleton
   rule; its token mean is taken per micro-batch at training time (`flowlearn.training.batches`).
5. The weights here are one process's; training rescales them to the counts of all processes
   (`weight_count`) before the loss.
6. The logged logprobs are the old policy's only if they describe the distribution the trainer
   scores: TRL's forward is `log_softmax(logits / temperature)` over the whole vocabulary (its
   `top_p` only reaches generation). So a row must have been sampled at the trainer's
   temperature, and its logprobs must not be renormalised over a top-p nucleus, as a server's
   processed logprobs are (`logprobs_mode` in the recorded sampling). Such rows sit off the
   clip range before any update; they are refused, never trained on, wherever they come from:
   fresh rollouts, stored ones reused on resume, or an offline file. A top-p below 1 with
   full-distribution logprobs (`HFPolicy`, raw logprobs at temperature 1) is accepted: the ratio
   is then the one TRL's own vLLM path uses. A transition without recorded sampling (hand-built
   data) cannot be checked and is accepted.
7. Every row or trajectory left out is counted (`rows_dropped`, `trajectories_dropped`), so a
   step that trains on less than it rolled out says so in the metrics.
8. `mask_truncated` is TRL's `mask_truncated_completions` (DAPO's overlong filtering): a turn
   cut off by its token budget is not trained on (`Truncation`, counted in `rows_truncated`),
   as TRL zeroes such a completion's mask. A turn is truncated when it spent its recorded budget
   (`sampling.max_new_tokens`) without ending in one of `end_ids` (EOS, pad: TRL's own test) or
   when it is longer than `max_completion_length`. A stop string that ended a turn exactly on
   its budget's last token is not told apart (the transition does not record why it ended).
   Its trajectory's reward still counts in its group's advantage statistics, as other left-out
   turns' do.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from flowlearn.engine.sampling import Sampling, token_faithful, token_problem
from flowlearn.errors import DataError
from flowlearn.nodes.schema.records import Transition
from flowlearn.training.trajectories import DROPPED, TOKEN_RULE, Trajectory, check_trajectories

MODES = ("paper", "verl_like", "sequence")
RENAMED_MODES = {"official": "verl_like"}
"""Old names of modes. `official` was renamed: TRL fixes the number of optimizer steps per
rollout batch, so the mode reproduces verl v0.5.0's arithmetic but not all of its batching
(README, "The `verl_like` mode")."""


Mode = Literal["paper", "verl_like", "sequence"]
Scale = Literal["group", "batch", "none"]
SCALES = ("group", "batch", "none")


@dataclass
class FlowGRPORow:
    """One trainable turn."""

    trajectory_id: str
    group_id: str
    turn: int
    prompt_ids: list[int]
    completion_ids: list[int]
    old_logprobs: list[float]
    advantage: float
    """The trajectory's advantage, broadcast to every token of this turn."""
    token_weight: float
    """The loss weight of each token of this turn under the chosen mode."""
    reward: float
    node: str = "planner"
    position: int = 0
    """The turn's 0-based index among its trajectory's kept turns: its identity in the
    trajectory, since two nodes may carry tokens in the same turn."""
    policy_version: str | None = None
    """The version of the policy that sampled it (with the planner on a server: the adapter)."""
    token_scales: list[float] | None = None
    """Per-token factors on the advantage: the importance weights of a stale row
    (`flowlearn.training.vllm.correction`); None: 1."""


@dataclass(frozen=True)
class StepCredit:
    """GiGPO-style step credit, beyond the paper (off unless given).

    Planner turns of the same question that saw the same input (identical prompt ids, i.e. the
    same memory state) form a step group; their discounted returns `gamma^(T_i - t) * R_i` are
    normalised within the step group and added, times `weight`, to the trajectory advantage.
    """

    weight: float = 1.0
    gamma: float = 0.95


@dataclass
class FlowGRPOBatch:
    """Rows plus what happened while building them."""

    rows: list[FlowGRPORow]
    stats: dict[str, Any] = field(default_factory=dict)


def build_flow_grpo_rows(
    trajectories: Iterable[Trajectory],
    mode: Mode = "paper",
    *,
    nodes: Sequence[str] | None = ("planner",),
    scale: Scale = "group",
    drop_zero_variance: bool = False,
    eps: float = 1e-6,
    max_prompt_length: int | None = None,
    max_completion_length: int | None = None,
    step_credit: StepCredit | None = None,
    sampling: Sampling | None = None,
    mask_truncated: bool = False,
    end_ids: Collection[int] = (),
    vocab_size: int | None = None,
) -> FlowGRPOBatch:
    """Build Flow-GRPO rows from rewarded trajectories grouped by `group_id`.

    Args:
        trajectories: rollouts, G per group; `total_reward` is the outcome.
        mode: `paper` (Eq. 10 weights, default), `verl_like` (the official code: the turns of a
            question pooled for normalisation, token-mean loss) or `sequence` (each row's
            tokens averaged, rows averaged).
        nodes: which nodes' transitions become rows (the planner by default); None: every
            transition that carries token ids, whatever node wrote it.
        scale: divide by the group's std (`group`), the whole batch's std (`batch`), or not
            at all (`none`, Dr. GRPO style).
        drop_zero_variance: drop groups whose rewards are all equal (no signal).
        eps: added to the std.
        max_prompt_length: rows with longer prompts are dropped (counted in the stats).
        max_completion_length: longer completions are cut to this length (counted).
        step_credit: add GiGPO-style step-group advantages (see `StepCredit`); None = paper.
        sampling: the trainer's sampling; a row recorded with another temperature, or with
            processed logprobs under top-p < 1, is refused (`check_sampling`).
        mask_truncated: leave out turns cut off by their token budget (`Truncation`), counted.
        end_ids: token ids that end a completion (EOS, pad); a turn whose last token is one
            ended by itself, even on its budget's last token.
        vocab_size: the trained model's vocabulary (`len(tokenizer)`); a kept turn with an id
            outside it is refused. None: ids are only checked to be whole numbers >= 0.

    A policy call that failed (`parse_status` "error", no completion ids: a server that did
    not answer) has no tokens to train; it is left out and counted in `rows_dropped`.

    Raises:
        ValueError: unknown mode or scale, a transition without token ids, or one whose
            recorded sampling does not match `sampling`.
        DataError: a reward, reward term or logprob that is not a finite number, a logprob
            above 0, or a token id that is negative or outside `vocab_size`.

    """
    check_mode(mode)
    if scale not in SCALES:
        raise ValueError(f"unknown scale {scale!r}; use one of {SCALES}")
    trajectories = list(trajectories)
    check_trajectories(trajectories)  # one NaN reward would make its group's advantages NaN
    stats: dict[str, Any] = {
        "rows_cut": 0,
        "rows_dropped": 0,
        "rows_truncated": 0,
        "trajectories_dropped": 0,
    }
    groups = group_trajectories(trajectories, stats)
    stats["groups"] = len(groups)
    cut_off = Truncation(max_completion_length, frozenset(end_ids)) if mask_truncated else None
    turns = kept_turns(
        groups, nodes, max_prompt_length, sampling, stats, truncation=cut_off, vocab_size=vocab_size
    )
    zero_variance = {g for g, m in groups.items() if len({t.total_reward for t in m}) == 1}
    stats["zero_variance_share"] = len(zero_variance) / len(groups) if groups else 0.0
    if drop_zero_variance:
        groups = drop_groups(groups, zero_variance, turns, stats)
    by_trajectory = advantages(groups, turns, mode, scale, eps)
    rows = _rows(groups, turns, by_trajectory, max_completion_length, stats)
    if step_credit is not None:
        stats["step_groups"] = _add_step_credit(rows, turns, groups, step_credit, eps)
    # A trajectory with no kept rows stays in the advantage statistics above: its reward is a
    # sample of the policy's outcome on the question, and leaving it out would bias the
    # baseline (over-long prompts that go with failures would raise the mean). It is left out
    # of Eq. 10's G: it has no tokens to weigh, so counting it would only shrink the weight
    # of the others and the question's total below 1/Q, as an empty question is left out of Q.
    assign_weights(rows, with_rows(groups, turns, stats), mode)
    members = [t for m in groups.values() for t in m]
    count = len(members) or 1  # the means of no trajectories are 0
    stats.update(
        rows=len(rows),
        tokens=sum(len(r.completion_ids) for r in rows),
        mean_reward=sum(t.total_reward for t in members) / count,
        mean_turns=sum(len(turns[t.trajectory_id]) for t in members) / count,
        trained_groups=len(groups),
    )
    return FlowGRPOBatch(rows, stats)


def _rows(
    groups: dict[str, list[Trajectory]],
    turns: dict[str, list[Transition]],
    advantages: dict[str, float],
    max_completion_length: int | None,
    stats: dict[str, Any],
) -> list[FlowGRPORow]:
    """Return one row per kept turn, completions cut to `max_completion_length` (counted)."""
    rows: list[FlowGRPORow] = []
    for group_id, members in groups.items():
        for trajectory in members:
            for position, transition in enumerate(turns[trajectory.trajectory_id]):
                # Rows share the transitions' id lists (read-only downstream): no copies.
                completion = transition.get("completion_ids") or []
                logprobs = transition.get("logprobs") or []
                if max_completion_length and len(completion) > max_completion_length:
                    completion = completion[:max_completion_length]
                    logprobs = logprobs[:max_completion_length]
                    stats["rows_cut"] += 1
                rows.append(
                    FlowGRPORow(
                        trajectory_id=trajectory.trajectory_id,
                        group_id=group_id,
                        turn=transition["turn"],
                        prompt_ids=transition.get("prompt_ids") or [],
                        completion_ids=completion,
                        old_logprobs=logprobs,
                        advantage=advantages[trajectory.trajectory_id],
                        token_weight=0.0,
                        reward=trajectory.total_reward,
                        node=transition["node"],
                        position=position,
                        policy_version=transition.get("policy_version"),
                    )
                )
    return rows


def _add_step_credit(
    rows: list[FlowGRPORow],
    turns: dict[str, list[Transition]],
    groups: dict[str, list[Trajectory]],
    credit: StepCredit,
    eps: float,
) -> int:
    """Add normalised discounted returns within step groups; return how many groups had > 1."""
    rewards = {t.trajectory_id: t.total_reward for m in groups.values() for t in m}
    returns: dict[tuple[str, tuple[int, ...]], list[tuple[FlowGRPORow, float]]] = defaultdict(list)
    for row in rows:  # keyed by position: two nodes may share a turn number
        remaining = len(turns[row.trajectory_id]) - 1 - row.position
        value = credit.gamma**remaining * rewards[row.trajectory_id]
        returns[(row.group_id, tuple(row.prompt_ids))].append((row, value))
    shared = 0
    for members in returns.values():
        if len(members) < 2:
            continue
        shared += 1
        values = [value for _, value in members]
        mean, spread = sum(values) / len(values), std(values)
        for row, value in members:
            row.advantage += credit.weight * (value - mean) / (spread + eps)
    return shared


def where(transition: Transition) -> str:
    """Name a transition in a message: its trajectory, turn and node."""
    return (
        f"{transition['node']} transition of trajectory {transition.get('trajectory_id')!r} "
        f"turn {transition['turn']}"
    )


def check_faithful(transition: Transition) -> None:
    """Refuse a transition without the token ids and logprobs training needs."""
    if not token_faithful(transition):
        raise ValueError(
            f"{where(transition)} has no token ids/logprobs: its policy was a plain chat model "
            "(inference only). Collect rollouts with HFPolicy (or another token-faithful "
            "Policy) to train on them; text is never re-tokenised."
        )


def failed_call(transition: Transition) -> bool:
    """Whether a transition records a policy call that failed: an error, and no tokens.

    The planner records one when its server did not answer (`nodes.planner.failed_decision`);
    there is nothing sampled to train on, so it is no row.
    """
    return transition.get("parse_status") == "error" and not transition.get("completion_ids")


def check_tokens(transition: Transition, vocab_size: int | None) -> None:
    """Refuse a transition whose ids lie outside the vocabulary or whose logprobs are not ones.

    Raises:
        DataError: naming the trajectory, turn and field (`engine.sampling.token_problem`).

    """
    problem = token_problem(transition, vocab_size)
    if problem is not None:
        raise DataError(f"{where(transition)}: field {problem}: {TOKEN_RULE}")


def check_sampling(transition: Transition, trainer: Sampling) -> None:
    """Refuse a transition whose recorded sampling the trainer's logprobs cannot reproduce.

    Args:
        transition: a token-faithful transition, with its `sampling` as recorded.
        trainer: the trainer's sampling (its temperature and top_p).

    Raises:
        ValueError: a recorded temperature other than the trainer's, processed logprobs with
            a top-p below 1, or raw logprobs at a temperature other than 1, naming the
            trajectory, turn, recorded and trainer values.

    """
    recorded = transition.get("sampling") or {}
    temperature = recorded.get("temperature")
    if temperature is not None and not math.isclose(
        float(temperature), trainer.temperature, rel_tol=1e-9, abs_tol=1e-12
    ):
        raise ValueError(
            f"{where(transition)} was sampled at temperature {temperature}, the trainer scores "
            f"at temperature {trainer.temperature}: its logprobs are not the old policy's "
            f"(ratios start far from 1, many tokens clipped). Train with temperature "
            f"{temperature}, or collect again at {trainer.temperature}"
        )
    top_p = float(recorded.get("top_p", trainer.top_p))
    mode = recorded.get("logprobs_mode")
    if mode == "processed" and top_p < 1:
        raise ValueError(
            f"{where(transition)} has processed logprobs (renormalised over the top-p {top_p} "
            f"nucleus) but the trainer scores the full distribution (trainer top_p "
            f"{trainer.top_p} applies to sampling only): every ratio starts below 1, on the clip "
            "floor. Collect with top_p 1, or at temperature 1 with raw logprobs "
            "(ServerPolicy logprobs_mode='raw', vLLM --logprobs-mode raw_logprobs)"
        )
    if mode == "raw" and temperature is not None and float(temperature) not in (0.0, 1.0):
        raise ValueError(
            f"{where(transition)} has raw logprobs (before temperature) but was sampled at "
            f"temperature {temperature} (trainer: {trainer.temperature}): they are not the "
            "sampling distribution's; serve with --logprobs-mode processed_logprobs"
        )


def group_trajectories(
    trajectories: Iterable[Trajectory], stats: dict[str, Any]
) -> dict[str, list[Trajectory]]:
    """Group by question, leaving out (and counting) trajectories marked `metadata[DROPPED]`."""
    groups: dict[str, list[Trajectory]] = {}
    for trajectory in trajectories:
        if trajectory.metadata.get(DROPPED):
            stats["trajectories_dropped"] += 1
            continue
        groups.setdefault(trajectory.group_id, []).append(trajectory)
    return groups


def kept_turns(
    groups: dict[str, list[Trajectory]],
    nodes: Sequence[str] | None,
    max_prompt_length: int | None,
    sampling: Sampling | None,
    stats: dict[str, Any],
    *,
    truncation: Truncation | None = None,
    vocab_size: int | None = None,
) -> dict[str, list[Transition]]:
    """Return each trajectory's trainable turns: by node, checked, within the prompt length.

    With `nodes` None, a policy call that carries no token ids (a server that returned none) is
    left out and counted; a call that is not a policy's (no `completion_ids` key) is no row.
    A failed call of a trained node (`failed_call`) is left out and counted too, and so are
    the turns a `truncation` finds cut off. A kept turn's ids must lie in `vocab_size`.
    """
    turns: dict[str, list[Transition]] = {}
    for members in groups.values():
        for trajectory in members:
            kept = []
            for transition in trajectory.transitions:
                if nodes is None and transition.get("completion_ids") is None:
                    stats["rows_dropped"] += "completion_ids" in transition
                    continue
                if nodes is not None and transition["node"] not in nodes:
                    continue
                if failed_call(transition):
                    stats["rows_dropped"] += 1
                    continue
                check_faithful(transition)
                check_tokens(transition, vocab_size)
                if sampling is not None:
                    check_sampling(transition, sampling)
                prompt = transition.get("prompt_ids") or []
                if max_prompt_length and len(prompt) > max_prompt_length:
                    stats["rows_dropped"] += 1
                    continue
                if truncation is not None and truncation.cut_off(transition):
                    stats["rows_truncated"] += 1
                    continue
                kept.append(transition)
            turns[trajectory.trajectory_id] = kept
    return turns


@dataclass(frozen=True)
class Truncation:
    """Which turns were cut off by a token budget (`mask_truncated`)."""

    max_completion_length: int | None = None
    """Turns longer than this are cut off too (they would be cut to it for training)."""
    end_ids: frozenset[int] = frozenset()
    """Token ids that end a completion (EOS, pad): a turn ending in one was not cut off."""

    def cut_off(self, transition: Transition) -> bool:
        """Whether the turn spent its recorded token budget unended, or runs past the length.

        A turn that ended on a stop string on its budget's last token counts as cut off: the
        transition does not say why it ended. A turn recorded without its budget (no
        `sampling.max_new_tokens`, as in trajectories stored by older versions) is cut off only
        past `max_completion_length`.
        """
        ids = transition.get("completion_ids") or []
        budget = (transition.get("sampling") or {}).get("max_new_tokens")
        limit = self.max_completion_length
        spent = isinstance(budget, int) and len(ids) >= budget and ids[-1] not in self.end_ids
        return spent or (limit is not None and len(ids) > limit)


def drop_groups(
    groups: dict[str, list[Trajectory]],
    dropped: set[str],
    turns: dict[str, list[Transition]],
    stats: dict[str, Any],
) -> dict[str, list[Trajectory]]:
    """Return `groups` without the `dropped` ones, counting their trajectories and rows."""
    for group_id in dropped & set(groups):
        stats["trajectories_dropped"] += len(groups[group_id])
        stats["rows_dropped"] += sum(len(turns[t.trajectory_id]) for t in groups[group_id])
    return {g: m for g, m in groups.items() if g not in dropped}


def with_rows(
    groups: dict[str, list[Trajectory]],
    turns: dict[str, list[Transition]],
    stats: dict[str, Any],
) -> dict[str, list[Trajectory]]:
    """Return each group's trajectories that have kept turns; count the others as dropped."""
    out: dict[str, list[Trajectory]] = {}
    for group_id, members in groups.items():
        trained = [t for t in members if turns[t.trajectory_id]]
        stats["trajectories_dropped"] += len(members) - len(trained)
        if trained:
            out[group_id] = trained
    return out


def check_mode(mode: str) -> None:
    """Refuse a mode that is not one of `MODES`, naming the new name of a renamed one."""
    refuse_renamed_mode(mode)
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; use one of {MODES}")


def refuse_renamed_mode(mode: str) -> None:
    """Refuse a mode's old name (`RENAMED_MODES`), saying its new name and why."""
    if mode in RENAMED_MODES:
        raise ValueError(
            f"mode {mode!r} is now {RENAMED_MODES[mode]!r}: it reproduces the official code's "
            "arithmetic (verl v0.5.0) where TRL can express it; the README's section on the "
            f"{RENAMED_MODES[mode]} mode lists what differs"
        )


def std(values: Sequence[float], ddof: int = 0) -> float:
    """Return the standard deviation: population (ddof=0), or unbiased (ddof=1, torch.std)."""
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - ddof))


def advantages(
    groups: dict[str, list[Trajectory]],
    turns: dict[str, list[Transition]],
    mode: str,
    scale: str,
    eps: float,
) -> dict[str, float]:
    """A_i = (R_i - mean) / (std + eps) per trajectory (population std).

    `verl_like` is verl v0.5.0's `compute_grpo_outcome_advantage`, which the official code
    runs: a question's turn-samples pooled (each carries its trajectory's R), the unbiased std
    (`torch.std`), and a question with a single sample gets mean 0 and std 1.
    """
    verl_like = mode == "verl_like"
    ddof = int(verl_like)

    def samples(members: list[Trajectory]) -> list[float]:
        if verl_like:  # every turn-sample counts once in the statistics
            return [t.total_reward for t in members for _ in turns[t.trajectory_id]] or [
                t.total_reward for t in members
            ]
        return [t.total_reward for t in members]

    batch = [r for members in groups.values() for r in samples(members)]
    batch_std = std(batch, ddof) if len(batch) > ddof else 0.0
    out: dict[str, float] = {}
    for members in groups.values():
        values = samples(members)
        mean, spread = sum(values) / len(values), std(values, ddof) if len(values) > ddof else 0.0
        if verl_like and len(values) == 1:
            mean, spread = 0.0, 1.0
        denominator = {"group": spread + eps, "batch": batch_std + eps, "none": 1.0}[scale]
        for trajectory in members:
            out[trajectory.trajectory_id] = (trajectory.total_reward - mean) / denominator
    return out


def assign_weights(
    rows: Sequence[FlowGRPORow], groups: dict[str, list[Trajectory]], mode: str
) -> None:
    """Set token weights so that sum(token_weight * objective) is the mode's objective.

    Training rescales them to all processes' `weight_count` and sets `verl_like`'s per
    micro-batch (`flowlearn.training.batches`).
    """
    if not rows:
        return
    count = weight_count(rows, mode)
    if mode == "verl_like":  # token mean over the whole batch
        for row in rows:
            row.token_weight = 1.0 / count if count else 0.0
        return
    if mode == "sequence":
        for row in rows:
            row.token_weight = 1.0 / (count * max(len(row.completion_ids), 1))
        return
    rows_per_trajectory: dict[str, int] = defaultdict(int)
    for row in rows:
        rows_per_trajectory[row.trajectory_id] += 1
    size = {group_id: len(members) for group_id, members in groups.items()}
    for row in rows:
        row.token_weight = 1.0 / (
            count
            * size[row.group_id]
            * rows_per_trajectory[row.trajectory_id]
            * max(len(row.completion_ids), 1)
        )


def weight_count(rows: Sequence[FlowGRPORow], mode: str) -> int:
    """Return what a mode's weights divide by: questions (paper), rows (sequence), tokens."""
    if mode == "paper":
        return len({row.group_id for row in rows})
    if mode == "sequence":
        return len(rows)
    return sum(len(row.completion_ids) for row in rows)
