"""Asynchronous Flow-GRPO: a producer thread rolls the next steps out while the trainer updates.

How it fits TRL's loop (one generation batch per optimizer step, TRL's default layout):
1. `FlowGRPOTrainer.get_batch_samples` reads TRL's epoch iterator `max_staleness` steps ahead
   (`Lookahead`) and hands each step's questions to the producer (`submit`), in TRL's order.
2. The producer rolls step j out with the newest weights it has, waiting until they are at least
   version `j - max_staleness` (version = updates done): step j's rows were sampled at most
   `max_staleness` updates ago (0 would wait for every update: the synchronous loop).
3. `_generate_and_score_completions` takes step j's rollouts (`take`), after checking that they
   answer the questions TRL handed that step. Rows older than the weights being trained are
   importance-corrected as the server path's stale rows are
   (`vllm.correction.correct_stale_rows`: the ratio's denominator becomes the trainer's
   logprobs now, the gap to the sampler truncated at `stale_importance_cap`).
4. After each update the trainer `publish`es its trainable weights (a clone: the copy is the
   only time either side waits for the other); the producer loads them between steps.

Why a thread of our own, not `trl.experimental.async_grpo`: TRL 1.16's worker is a child process
that samples single-turn chats from a vLLM server and packs them itself; a flow's rollouts are
LangGraph runs with tools, on the in-process HF policy or the server, and their transitions are
already the rows. A thread keeps the graph, tools and stores in one process; decoding and tool
waits release the GIL, so the two sides overlap. What TRL's design gives us is kept: a version
per sample, a bound on staleness (TRL's `max_staleness`), stale samples never trained on, and a
stall limit (TRL's `heartbeat_stale_after_s`).
"""

from __future__ import annotations

import copy
import logging
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from transformers import TrainerCallback

from flowlearn.errors import FlowlearnError
from flowlearn.evals.cases import Case
from flowlearn.training.trajectories import DROPPED, Trajectory

logger = logging.getLogger(__name__)

VERSION = re.compile(r"@(\d+)(?::[^@]*)?$|^flow-.+?-step(\d+)(?:-.*)?$")
"""A trained policy's version: `<output_dir>@<step>[:<node>]` or `flow-<run>-step<k>[-<node>]`."""

DEFAULT_CAP = 2.0
"""The truncated importance-sampling cap of stale rows: verl's `tis_imp_ratio_cap` default."""

Roll = Callable[[Any, list[Case], int, int], list[Trajectory]]
"""`(model, cases, step, version) -> trajectories`: one step's rollouts on a weights snapshot."""


class ProducerError(FlowlearnError, RuntimeError):
    """The rollout producer crashed or stalled; the run stops, its checkpoints kept."""


@dataclass
class Produced:
    """One step's rollouts, as the producer made them."""

    step: int
    """The update they train (TRL's `global_step` before it)."""
    cases: list[Case]
    version: int
    """The weights that sampled them: updates done when the step's rollouts began."""
    trajectories: list[Trajectory]
    seconds: float  # the rollouts' wall time
    waited: float  # the producer's wait for weights within the staleness bound, before them


def snapshot_of(model: Any) -> Any:
    """Return a copy of `model` for the producer to sample with.

    Its trainable tensors are its own; every frozen parameter and buffer is shared (they never
    change). In eval mode, without gradients. With LoRA only the adapters are copied; a full
    fine-tune copies the whole model once.
    """
    import torch

    memo: dict[int, Any] = {}
    for tensor in [*model.parameters(), *model.buffers()]:
        if not tensor.requires_grad:
            memo[id(tensor)] = tensor  # deepcopy hands back the same object
    with torch.no_grad():
        snapshot = copy.deepcopy(model, memo)
    for module in snapshot.modules():
        # A patched forward is an instance attribute whose closure holds the live model's own
        # forward (TRL's `add_fused_lm_head`, accelerate's autocast): deepcopy rebinds the method
        # but not the closure, so the copy would run the live weights. The class's forward it is.
        module.__dict__.pop("forward", None)
    for parameter in snapshot.parameters():
        parameter.requires_grad_(False)
    snapshot.eval()
    return snapshot


def trainable_state(model: Any) -> dict[str, Any]:
    """Return a detached clone of `model`'s trainable parameters, by name."""
    return {
        name: parameter.detach().clone()
        for name, parameter in model.named_parameters()
        if parameter.requires_grad
    }


def load_state(snapshot: Any, state: dict[str, Any]) -> None:
    """Copy `state` (from `trainable_state`) into `snapshot`'s parameters of the same names."""
    import torch

    parameters = dict(snapshot.named_parameters())
    missing = [name for name in state if name not in parameters]
    if missing:
        raise ProducerError(f"the producer's snapshot lacks trained parameters {missing[:3]}")
    with torch.no_grad():
        for name, value in state.items():
            parameters[name].copy_(value)


class Lookahead:
    """TRL's epoch iterator, read ahead.

    The trainer takes items in order; more are read early, so the producer can roll their
    questions out before they are due.
    """

    def __init__(self, iterator: Iterator[Any]) -> None:
        self.iterator = iterator
        self.buffer: deque[Any] = deque()
        self.ended = False

    def __iter__(self) -> Lookahead:
        return self

    def __next__(self) -> Any:
        """Return the next item, read ahead or not (TRL's `get_batch_samples` takes them)."""
        self.fill(1)
        if not self.buffer:
            raise StopIteration
        return self.buffer.popleft()

    def take(self, count: int) -> list[Any]:
        """Return the next `count` items (fewer at the epoch's end)."""
        return [item for _, item in zip(range(count), self, strict=False)]

    def fill(self, count: int) -> None:
        """Read until `count` items wait in the buffer, or the epoch ends."""
        while len(self.buffer) < count and not self.ended:
            try:
                self.buffer.append(next(self.iterator))
            except StopIteration:
                self.ended = True

    def peek(self, index: int) -> Any:
        """Return the buffered item `index` places ahead (it must have been read)."""
        return self.buffer[index]


class RolloutProducer:
    """A thread that rolls out submitted steps in order, within `max_staleness` of the weights.

    Args:
        roll: makes one step's rollouts on the snapshot (`Roll`).
        snapshot: the model the producer samples with (`snapshot_of`), at `version`.
        version: the updates done when it starts (a resumed run's `global_step`).
        max_staleness: how many updates old a step's sampling weights may be when it trains.
        stall_after: seconds `take` waits for a step before it reports the producer stalled.

    """

    def __init__(
        self, roll: Roll, snapshot: Any, *, version: int, max_staleness: int, stall_after: float
    ) -> None:
        if max_staleness < 0:
            raise ValueError(f"max_staleness must be >= 0, got {max_staleness}")
        self.roll, self.snapshot = roll, snapshot
        self.max_staleness, self.stall_after = max_staleness, stall_after
        self.loaded = version
        """The version of the snapshot's weights."""
        self.published = version
        """The newest version the trainer published."""
        self.pending: tuple[int, dict[str, Any] | None] | None = None
        self.todo: deque[tuple[int, list[Case]]] = deque()
        self.done: dict[int, Produced] = {}
        self.submitted = version - 1
        """The last step handed over."""
        self.error: BaseException | None = None
        self.stopping = False
        self.busy_step: int | None = None
        self.condition = threading.Condition()
        self.thread = threading.Thread(target=self._run, name="flowlearn-rollouts", daemon=True)
        self.thread.start()

    def submit(self, step: int, cases: list[Case]) -> None:
        """Queue step `step`'s questions (steps are handed over once each, in order)."""
        with self.condition:
            if step <= self.submitted:
                return
            if step != self.submitted + 1:
                raise ProducerError(f"step {step} handed to the producer after {self.submitted}")
            self.submitted = step
            self.todo.append((step, cases))
            self.condition.notify_all()

    def publish(self, version: int, state: dict[str, Any] | None) -> None:
        """Give the producer the weights after `version` updates; it loads them between steps.

        None: nothing to load (a server holds the weights, pushed under the version's name).
        """
        with self.condition:
            self.published = version
            self.pending = (version, state)
            self.condition.notify_all()

    def take(self, step: int) -> tuple[Produced, float]:
        """Wait for step `step`'s rollouts; return them and how long the trainer waited.

        Raises:
            ProducerError: the producer crashed (its error chained), or made no step for
                `stall_after` seconds while this one was due.

        """
        started = time.perf_counter()
        with self.condition:
            while step not in self.done:
                if self.error is not None:
                    raise ProducerError(
                        f"the rollout producer crashed while rolling out step {self.busy_step}: "
                        f"{type(self.error).__name__}: {self.error}. The run stops; its "
                        "checkpoints and written rollouts are kept, and --resume restarts it"
                    ) from self.error
                if step > self.submitted:
                    raise ProducerError(f"step {step} was never handed to the producer")
                if time.perf_counter() - started > self.stall_after:
                    raise ProducerError(
                        f"the rollout producer made no step in {self.stall_after:.0f} s while "
                        f"step {step} was due (rolling out step {self.busy_step}): a tool or "
                        "model call may hang. Raise producer_stall_s if steps are this slow"
                    )
                self.condition.wait(timeout=min(1.0, self.stall_after))
            produced = self.done.pop(step)
        return produced, time.perf_counter() - started

    def stop(self) -> None:
        """Stop after the step in flight; its rollouts and any queued are dropped, never trained."""
        with self.condition:
            self.stopping = True
            self.todo.clear()
            self.condition.notify_all()

    def _run(self) -> None:
        try:
            while True:
                with self.condition:
                    while not self.todo and not self.stopping:
                        self.condition.wait()
                    if self.stopping:
                        return
                    step, cases = self.todo.popleft()
                    started = time.perf_counter()
                    while self.published < step - self.max_staleness and not self.stopping:
                        self.condition.wait()
                    if self.stopping:
                        return
                    pending, self.pending = self.pending, None
                    self.busy_step = step
                waited = time.perf_counter() - started
                if pending is not None:  # the copy: the only wait the trainer causes
                    if pending[1] is not None:  # None: on a server, the adapters were pushed
                        load_state(self.snapshot, pending[1])
                    self.loaded = pending[0]
                version = self.loaded
                began = time.perf_counter()
                trajectories = self.roll(self.snapshot, cases, step, version)
                seconds = time.perf_counter() - began
                with self.condition:
                    self.done[step] = Produced(step, cases, version, trajectories, seconds, waited)
                    self.busy_step = None
                    self.condition.notify_all()
        except BaseException as exc:  # reported by `take`, on the trainer's thread
            logger.exception("the rollout producer crashed")
            with self.condition:
                self.error = exc
                self.condition.notify_all()


def version_of(policy_version: str | None) -> int | None:
    """Return the updates done in a `policy_version`, or None (not a trained policy's).

    In-process: `<output_dir>@<step>` (`:<node>` or `:base` after it); on a vLLM server, the
    adapter's name `flow-<run id>-step<step>` (`-<node>` after it).
    """
    if not policy_version:
        return None
    match = VERSION.search(policy_version)
    if match is None:
        return None
    return int(match.group(1) or match.group(2))


def check_async(trainer: Any) -> None:
    """Refuse what the producer does not run yet, naming the setting to change.

    Raises:
        ValueError: an offline source, a served or TRL vLLM planner, several processes, more
            than one generation per update, or an engine on the trained model itself.

    """
    from flowlearn.training.rollouts import Rollouts

    args, staleness = trainer.args, trainer.max_staleness
    problems = []
    if not isinstance(trainer.source, Rollouts):
        problems.append("offline training replays stored rollouts; there is nothing to overlap")
    if trainer.vllm is not None:
        problems.append("use_vllm (TRL's vLLM engine syncs weights between its own steps)")
    if int(args.steps_per_generation) != int(args.gradient_accumulation_steps):
        problems.append(
            f"steps_per_generation {args.steps_per_generation} with gradient_accumulation_steps "
            f"{args.gradient_accumulation_steps}: one generation per update is needed"
        )
    if int(getattr(trainer, "num_iterations", 1)) != 1:
        problems.append(f"num_iterations {trainer.num_iterations}: one pass per generation")
    if engine_on_trained_model(trainer) and trainer.model_handle is None:
        problems.append("an engine on the trained model whose handle the trainer was not given")
    if problems:
        raise ValueError(
            f"max_staleness {staleness} (asynchronous rollouts) does not run with: "
            + "; ".join(problems)
            + ". Set max_staleness 0 (synchronous) or change those settings"
        )


def engine_on_trained_model(trainer: Any) -> bool:
    """Whether the fixed engine decodes on the trained model (its frozen base under LoRA).

    Its calls would run on the weights the trainer is updating, adapters toggled under it, so
    under `max_staleness` its handle moves onto the producer's snapshot (`AsyncRollouts`). A
    `FlowGRPOConfig` says so with `engine: base` (TRL's shape, `flowlearn train`); under any
    other config, `online` was given a `handle` the caller shares with other policies.
    """
    if hasattr(trainer.args, "engine"):  # a FlowGRPOConfig names it
        return bool(trainer.args.engine == "base")
    return trainer.model_handle is not None


class AsyncRollouts(TrainerCallback):
    """The trainer's side of asynchronous rollouts.

    It reads TRL's batches ahead and hands them to the producer, takes each step's rollouts,
    corrects and logs the stale rows, and publishes the weights after each update.

    Made by `FlowGRPOTrainer` when `max_staleness` > 0; started at the first step (after a
    resumed checkpoint has loaded), stopped when training ends or fails.
    """

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer
        self.producer: RolloutProducer | None = None
        self.lookahead: Lookahead | None = None
        self._handle: Any = None  # the snapshot's, while the producer runs
        self.shared: tuple[Any, Any] | None = None
        """An engine on the trained model (`engine: base`): its handle, and the model it had.
        While the producer runs, the handle holds the snapshot, so the engine's calls and the
        planner's share one model and one lock, and never touch the weights being trained."""
        self.vocab_size = 0  # on a server: the trained model's embedding rows

    @classmethod
    def attach(cls, trainer: Any) -> AsyncRollouts | None:
        """Set `trainer.max_staleness` from its args; above 0, return its `AsyncRollouts`.

        It is registered as a callback: it publishes the weights after each update.
        """
        trainer.max_staleness = int(getattr(trainer.args, "max_staleness", 0) or 0)
        if trainer.max_staleness <= 0:
            return None
        rollouts = cls(trainer)
        trainer.add_callback(rollouts)
        return rollouts

    def reading(self, epoch_iterator: Iterator[Any]) -> Lookahead:
        """Return TRL's epoch iterator read ahead: the one given to `get_batch_samples`."""
        if self.lookahead is None or self.lookahead.iterator is not epoch_iterator:
            self.lookahead = Lookahead(epoch_iterator)  # a new epoch (or the first)
        return self.lookahead

    def hand_over(self, samples: list[Any], count: int) -> None:
        """Give the producer this step's questions and up to `max_staleness` steps' after it.

        `samples` are this step's `count` batches, TRL's generation batch repeated.
        """
        if not samples or self.lookahead is None:
            return
        trainer = self.trainer
        producer = self.start()
        step = int(trainer.state.global_step)
        steps_left = int(trainer.state.max_steps) - step - 1  # set from epochs too, by then
        ahead = max(0, min(trainer.max_staleness, steps_left))
        self.lookahead.fill(ahead * count)
        batches = [samples[0]]
        ready = len(self.lookahead.buffer) // count
        batches += [self.lookahead.peek(i * count) for i in range(ready)]
        for offset, batch in enumerate(batches[: ahead + 1]):
            producer.submit(step + offset, questions_of(batch))

    def start(self) -> RolloutProducer:
        """Start the producer on a snapshot of the weights as they are now."""
        if self.producer is not None:
            return self.producer
        trainer = self.trainer
        check_async(trainer)
        live = trainer.accelerator.unwrap_model(trainer.model)
        version = int(trainer.state.global_step)
        snapshot = None
        if trainer.server is None:
            snapshot = snapshot_of(live)
            if engine_on_trained_model(trainer):  # the engine's handle: on the snapshot too
                self.shared = (trainer.model_handle, trainer.model_handle.model)
                trainer.model_handle.model = snapshot
                self._handle = trainer.model_handle
        else:  # the server samples: its adapters, pushed per version, kept while in use
            self.vocab_size = int(live.get_input_embeddings().num_embeddings)
            adapters = trainer.server.server
            adapters.keep = max(adapters.keep, trainer.max_staleness + 2)
            trainer.server.publish_at(trainer, live, version)
        self.producer = RolloutProducer(
            self.roll,
            snapshot,
            version=version,
            max_staleness=trainer.max_staleness,
            stall_after=float(getattr(trainer.args, "producer_stall_s", 600.0)),
        )
        return self.producer

    def roll(self, model: Any, cases: list[Case], step: int, version: int) -> list[Trajectory]:
        """One step's rollouts on the producer's snapshot, versioned as the live policy is."""
        from flowlearn.engine.tokens import ModelHandle
        from flowlearn.training.roles import local_policy, sampled_by_role

        trainer = self.trainer
        if trainer.server is not None:  # under the adapters of `version`, pushed by `publish`
            served = trainer.server.policy_at(trainer, version, self.vocab_size)
            policy = sampled_by_role(served, trainer.roles)
        else:
            if self._handle is None or self._handle.model is not model:
                self._handle = ModelHandle(model, trainer.processing_class)
            tag = f"{trainer.args.output_dir}@{version}"
            policy = local_policy(self._handle, tag, trainer.roles)
        return trainer.source.run(  # type: ignore[no-any-return]
            policy,
            cases,
            group_size=trainer.group_size,
            context=trainer.flow_context,
            step=step,
            rank=trainer.accelerator.process_index,
            progress=False,
        )

    def take(self, cases: list[Case]) -> list[Trajectory]:
        """Return this step's rollouts, checked against the questions TRL handed the step."""
        trainer = self.trainer
        step = int(trainer.state.global_step)
        assert self.producer is not None, "get_batch_samples starts the producer"
        produced, waited = self.producer.take(step)
        if [c.id for c in produced.cases] != [c.id for c in cases]:
            raise ProducerError(
                f"step {step}'s rollouts answer other questions than TRL handed that step "
                f"({[c.id for c in produced.cases][:3]} against {[c.id for c in cases][:3]})"
            )
        too_old = drop_too_stale(
            produced.trajectories, step - trainer.max_staleness, self.trained()
        )
        metrics = trainer._metrics["train"]
        metrics["flow/too_stale_rollouts"].append(float(too_old))
        metrics["flow/staleness"].append(float(step - produced.version))
        metrics["flow/trainer_wait_s"].append(waited)
        metrics["flow/producer_wait_s"].append(produced.waited)
        metrics["flow/producer_rollout_s"].append(produced.seconds)
        return produced.trajectories

    def current(self, step: int) -> str | dict[str, str]:
        """Return the version names of the weights training now (each trained node's).

        The rows of any other version are stale; each node's are scored under its adapter.
        """
        trainer = self.trainer
        if trainer.server is not None:
            from flowlearn.training.vllm.lora_server import SINGLE

            names: dict[str, str] = trainer.server.names(trainer, step)
            return names if trainer.roles is not None else names[SINGLE]
        version = f"{trainer.args.output_dir}@{step}"
        if trainer.roles is None:
            return version
        return {node: f"{version}:{node}" for node in trainer.roles.nodes}

    def trained(self) -> str:
        """Return how the trained policy's versions begin (an engine's calls are not its own)."""
        trainer = self.trainer
        if trainer.server is not None:
            return f"flow-{getattr(trainer.source, 'run_id', None) or 'run'}-step"
        return f"{trainer.args.output_dir}@"

    def correct(self, rows: list[Any]) -> None:
        """Importance-correct the rows older weights sampled, and log the ratio's spread."""
        from flowlearn.training.vllm.correction import correct_stale_rows

        trainer = self.trainer
        step = int(trainer.state.global_step)
        versions = [version_of(r.policy_version) for r in rows]
        ages = [step - v for v in versions if v is not None]
        stale = [r for r, v in zip(rows, versions, strict=True) if v is not None and v < step]
        cap = float(getattr(trainer.args, "stale_importance_cap", DEFAULT_CAP))
        correct_stale_rows(trainer, stale, self.current(step), ("token_truncate", None, cap))
        metrics = trainer._metrics["train"]
        metrics["flow/row_staleness_max"].append(float(max(ages, default=0)))
        weights = [w for r in stale for w in (r.token_scales or [])]
        if not weights:
            return
        mean = sum(weights) / len(weights)
        metrics["flow/is_ratio_min"].append(min(weights))
        metrics["flow/is_ratio_max"].append(max(weights))
        spread = (sum((w - mean) ** 2 for w in weights) / len(weights)) ** 0.5
        metrics["flow/is_ratio_std"].append(spread)
        capped = sum(w >= cap * (1 - 1e-6) for w in weights)
        metrics["flow/is_capped_share"].append(capped / len(weights))

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """After each optimizer step: `publish`."""
        self.publish()

    def publish(self) -> None:
        """Hand the producer the weights of the update just made (after TRL's optimizer step)."""
        if self.producer is None:
            return
        trainer = self.trainer
        live = trainer.accelerator.unwrap_model(trainer.model)
        version = int(trainer.state.global_step)
        if int(trainer.state.max_steps) <= version:  # the last update: no rollout samples it
            return
        if trainer.server is not None:  # pushed here, on the trainer's thread, before it is named
            trainer.server.publish_at(trainer, live, version)
            self.producer.publish(version, None)
            return
        self.producer.publish(version, trainable_state(live))

    def stop(self) -> None:
        """Stop the producer; rollouts in flight are dropped, never trained.

        It waits for the step in flight to end (at most `producer_stall_s`), so that nothing
        samples or writes after training returns, and lets go of the snapshot.
        """
        if self.producer is not None:
            self.producer.stop()
            self.producer.thread.join(self.producer.stall_after)
            if self.producer.thread.is_alive():
                logger.warning(
                    "the rollout producer is still in a step %.0f s after training ended",
                    self.producer.stall_after,
                )
            self.producer.snapshot = None
            self.producer = None
        self._handle = None
        if self.shared is not None:  # the engine's handle back on the trained model
            handle, model = self.shared
            handle.model, self.shared = model, None


def drop_too_stale(trajectories: list[Trajectory], oldest: int, trained: str) -> int:
    """Mark dropped the rollouts with a trained-policy call older than `oldest`; count them.

    The trained policy's versions start with `trained` (`AsyncRollouts.trained`).

    The producer never samples past the bound, but a resumed run reuses the rollouts its store
    holds for a step (`collect`), whatever weights made them: those are checked here too.
    """
    count = 0
    for trajectory in trajectories:
        versions = [
            version_of(t.get("policy_version"))
            for t in trajectory.transitions
            if str(t.get("policy_version") or "").startswith(trained)
        ]
        stale = [v for v in versions if v is not None and v < oldest]
        if stale and DROPPED not in trajectory.metadata:
            trajectory.metadata[DROPPED] = (
                f"sampled by version {min(stale)}, older than max_staleness allows ({oldest})"
            )
            count += 1
    return count


def questions_of(batch: Any) -> list[Case]:
    """Return the distinct questions of one TRL generation batch, in order (G copies of each)."""
    from flowlearn.training.rollouts import sampled_cases

    return sampled_cases(batch)
