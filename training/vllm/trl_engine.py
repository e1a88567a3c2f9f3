"""Full fine-tuning on TRL's vLLM generation: the flow's planner calls on `VLLMGeneration`.

Why it is built this way:
1. TRL's own machinery does the vLLM work: `VLLMGeneration` (colocate or server, built from the
   config's `use_vllm` and `vllm_*` fields as `GRPOTrainer` builds it) generates, and its
   `sync_weights` pushes the trained weights. As in TRL's trainer, the weights are synced when
   the step changed since the last sync: before the first rollouts, then after every optimizer
   step, before the next rollouts.
2. The flow's concurrent planner calls are gathered into batched `generate` calls
   (`VLLMPolicy`). Many flows run at once (threads), each calling `generate(messages,
   sampling)` on the planner; the policy queues each call's prompt ids, the first waiting
   caller becomes the leader, lets the other flows' calls join for `max_wait_s`, then hands
   every queued prompt with the same sampling to one `generate` of the engine and gives each
   caller its own result. Calls that arrive while a batch runs form the next one. No thread of
   its own: a policy left behind ends with its last caller.
3. No collective where ranks can diverge. Each rank rolls out its own questions, so a rank whose
   flows take 3 planner turns calls generate more often than one whose flows take 1. Each rank's
   generate therefore needs no other rank:
   - colocate: every rank has its own engine, and `VLLMGeneration.generate` calls no collective
     with `vllm_tensor_parallel_size` 1 and sleep mode off (a TP group all-gathers the prompts in
     every call, sleep mode re-syncs weights inside it: both are refused).
   - server: TRL's `generate` gathers all ranks' prompts (`gather_object`) and broadcasts the
     results in every call; it would hang once one rank has more batches than another. So each
     rank sends its own batches to the server with TRL's `VLLMClient` (`/v1/completions` with
     token ids, plain HTTP), the main process's client being the one that holds TRL's
     weight-update communicator (`PerRankServer`).
   The alternative, a fixed number of collective rounds padded with empty batches, makes every
   rank wait for the slowest at each round and needs one more collective to agree when to
   stop; independent ranks need neither. `sync_weights` is collective (ZeRO-3 gathers, the main
   process's broadcast to the server), but it runs at one point that every rank reaches once
   per step, and a barrier follows it, so no rank samples from a server still taking weights.
4. vLLM's logprobs (processed: after temperature) are the behaviour policy's. With TRL's
   `vllm_importance_sampling_correction` (its default) the old logprobs are recomputed by a
   training forward and the loss is weighted by TRL's truncated or masked ratio between the two
   (`flowlearn.training.vllm.correction`), as TRL's own vLLM path does.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from accelerate.utils import is_peft_model
from trl.generation.vllm_client import VLLMClient
from trl.generation.vllm_generation import VLLMGeneration

from flowlearn.engine.batching import check_batching
from flowlearn.engine.local import chat_prompt_ids
from flowlearn.engine.sampling import Generation, Messages, Sampling
from flowlearn.engine.stops import StopWatch, watch_completion
from flowlearn.training.model import recompute_old_logps
from flowlearn.training.rollouts import Rollouts
from flowlearn.training.vllm.correction import importance_ratio
from flowlearn.training.vllm.settings import LORA_PATH, check_vllm_engine


class VLLMEngine(Protocol):
    """What the flow uses of TRL's `VLLMGeneration`: its sampling fields, generate, sync_weights."""

    temperature: float
    top_p: float
    max_completion_length: int
    generation_kwargs: dict[str, Any]

    def generate(
        self,
        prompts: list[list[int]],
        images: list[list[Any] | None] | None,
        num_generations: int,
        profiler: Any = None,
    ) -> tuple[Any, ...]:
        """Return (prompt_ids, completion_ids, logprobs, logprob_token_ids) per prompt."""
        ...

    def sync_weights(self) -> None:
        """Push the trained model's weights into the engine."""
        ...


VLLMFactory = Callable[[Any, Any, Any], VLLMEngine]
"""From (model, accelerator, processing_class), as `VLLMGeneration` takes them, to an engine."""

SERVER_LOGPROBS = {"processed_logprobs": "processed", "raw_logprobs": "raw"}
"""vLLM's `--logprobs-mode` values whose logprobs can be trained on, by provenance name."""


@dataclass
class _Call:
    """One queued planner call: its prompt ids, settings, submission time and future."""

    prompt_ids: list[int]
    sampling: Sampling
    submitted: float = field(default_factory=time.perf_counter)
    future: Future[Generation] = field(default_factory=Future)


@dataclass(eq=False)
class VLLMPolicy:
    """A token-faithful `Policy` whose concurrent calls share one `generate` of a vLLM engine.

    Attributes:
        engine: TRL's `VLLMGeneration` (colocate) or `PerRankServer` (server), or a stand-in.
        tokenizer: the trained model's tokenizer; its chat template renders the prompt.
        version: the policy version recorded in every transition (the trainer's step).
        max_batch_size: the most prompts one `generate` takes.
        max_wait_s: how long a batch waits for the calls of other flows in flight.
        logprobs_mode: `processed` (vLLM's logprobs after temperature, TRL's setting) or `raw`,
            recorded in each call's sampling for the provenance checks.
        context_window: the most tokens prompt plus completion may take; a longer call fails
            alone instead of failing its whole batch in vLLM.

    """

    continues_prefill: ClassVar[bool] = True
    """A final assistant message is continued, as the chat template renders it."""

    engine: VLLMEngine
    tokenizer: Any
    version: str
    max_batch_size: int = 64
    max_wait_s: float = 0.05
    logprobs_mode: str = "processed"
    context_window: int | None = None
    _pending: list[_Call] = field(init=False, default_factory=list, repr=False)
    _leading: bool = field(init=False, default=False, repr=False)
    _ready: threading.Condition = field(init=False, default_factory=threading.Condition)

    def __post_init__(self) -> None:
        """Check the settings.

        Raises:
            ValueError: a batch size below 1 or a negative wait.

        """
        check_batching(self.max_batch_size, self.max_wait_s)

    def encode_chat(self, messages: Messages) -> list[int]:
        """Render `messages` with the chat template and return the prompt's token ids."""
        return chat_prompt_ids(self.tokenizer, messages)

    def generate(
        self, messages: Messages, sampling: Sampling, *, stopping: StopWatch | None = None
    ) -> Generation:
        """Queue one call and return its completion once its batch is generated.

        A `stopping` watch (a chat model's: stop strings, a closed tool call, a repetition) is
        run over the sampled ids, which are cut where it fires, with their logprobs
        (`watch_completion`), as a local decode would have stopped there.

        Raises:
            ValueError: the prompt and `max_new_tokens` do not fit the context window.

        """
        prompt = self.encode_chat(messages)
        window = self.context_window
        if window is not None and len(prompt) + sampling.max_new_tokens > window:
            raise ValueError(
                f"a planner prompt of {len(prompt)} tokens with max_new_tokens="
                f"{sampling.max_new_tokens} does not fit vLLM's {window}-token window; lower "
                "max_completion_length or max_turns, or raise vllm_max_model_length"
            )
        call = _Call(prompt, sampling)
        with self._ready:
            self._pending.append(call)
        while not call.future.done():
            if self._lead():
                try:
                    self._serve()
                finally:
                    with self._ready:
                        self._leading = False
                        self._ready.notify_all()
        generation = call.future.result()
        if stopping is None or generation.completion_ids is None:
            return generation
        ids, logprobs, text = watch_completion(
            stopping, generation.completion_ids, generation.logprobs
        )
        return dataclasses.replace(generation, text=text, completion_ids=ids, logprobs=logprobs)

    def _lead(self) -> bool:
        """Become the caller that runs the next batch (True), or wait until a batch ends."""
        with self._ready:
            if not self._leading:
                self._leading = True
                return True
            self._ready.wait()
            return False

    def _serve(self) -> None:
        """Let company arrive, then generate the queued calls, one engine call per sampling."""
        with self._ready:
            full = len(self._pending) >= self.max_batch_size
        if not full:
            time.sleep(self.max_wait_s)
        with self._ready:
            batch = self._pending[: self.max_batch_size]
            del self._pending[: self.max_batch_size]
        groups: dict[Sampling, list[_Call]] = {}
        for call in batch:
            groups.setdefault(call.sampling, []).append(call)
        for sampling, calls in groups.items():
            self._run(sampling, calls)

    def _run(self, sampling: Sampling, calls: list[_Call]) -> None:
        """Generate `calls` in one engine call; an engine error fails them, a bad output one."""
        engine = self.engine
        try:
            engine.temperature, engine.top_p = sampling.temperature, sampling.top_p
            engine.max_completion_length = sampling.max_new_tokens
            kwargs = {k: v for k, v in (engine.generation_kwargs or {}).items() if k != "seed"}
            seed = {} if sampling.seed is None else {"seed": sampling.seed}
            engine.generation_kwargs = {**kwargs, **seed}
            _, completions, logprobs, _ = engine.generate([c.prompt_ids for c in calls], None, 1)
            if len(completions) != len(calls):
                raise RuntimeError(
                    f"the vLLM engine returned {len(completions)} completions for {len(calls)} "
                    "prompts"
                )
        except Exception as exc:  # the whole batch failed: every call in it fails with it
            for call in calls:
                call.future.set_exception(exc)
            return
        for index, call in enumerate(calls):
            try:
                rows = logprobs[index] if logprobs is not None else None
                call.future.set_result(self._generation(call, completions[index], rows))
            except Exception as exc:  # this call alone: the others keep their results
                call.future.set_exception(exc)

    def _generation(self, call: _Call, ids: Any, rows: Any) -> Generation:
        """Wrap one completion: its ids, the sampled tokens' logprobs (rank 0), the settings.

        Raises:
            ValueError: the engine returned no logprob for some token (vLLM's NaN).

        """
        completion = [int(token) for token in ids]
        firsts = [row[0] if row else None for row in rows or []]
        values = [float(value) for value in firsts if value is not None]
        if len(firsts) != len(completion) or len(values) != len(completion):
            raise ValueError(
                "the vLLM engine returned no logprob for some sampled token, so this planner "
                "call cannot be trained on; TRL builds VLLMGeneration with logprobs=0, keep it"
            )
        return Generation(
            text=self.tokenizer.decode(completion, skip_special_tokens=True),
            prompt_ids=call.prompt_ids,
            completion_ids=completion,
            logprobs=values,
            policy_version=self.version,
            sampling={**call.sampling.as_dict(), "logprobs_mode": self.logprobs_mode},
            seconds=time.perf_counter() - call.submitted,
        )


@contextmanager
def vllm_kept_from_trl(args: Any) -> Iterator[None]:
    """Hide `use_vllm` from TRL's constructor: the flow builds the engine (`attach_vllm`)."""
    saved = bool(getattr(args, "use_vllm", False))
    args.use_vllm = False
    try:
        yield
    finally:
        args.use_vllm = saved


def trl_factory(args: Any) -> VLLMFactory:
    """Return a factory of TRL's `VLLMGeneration`, set up as `GRPOTrainer` sets it up."""

    def build(model: Any, accelerator: Any, processing_class: Any) -> VLLMEngine:
        generation = VLLMGeneration(
            model=model,
            accelerator=accelerator,
            processing_class=processing_class,
            mode=args.vllm_mode,
            structured_outputs_regex=args.vllm_structured_outputs_regex,
            server_base_url=args.vllm_server_base_url,
            server_host=args.vllm_server_host,
            server_port=args.vllm_server_port,
            group_port=args.vllm_group_port,
            server_timeout=args.vllm_server_timeout,
            tensor_parallel_size=args.vllm_tensor_parallel_size,
            gpu_memory_utilization=args.vllm_gpu_memory_utilization,
            max_model_length=args.vllm_max_model_length,
            max_num_seqs=args.per_device_train_batch_size * args.steps_per_generation,
            enable_sleep_mode=args.vllm_enable_sleep_mode,
            model_impl=args.vllm_model_impl,
            trust_remote_code=args.trust_remote_code,
            temperature=args.temperature,
            top_p=args.top_p,
            max_completion_length=args.max_completion_length,
            logprobs=0,  # the sampled token's logprob only
            generation_kwargs=args.generation_kwargs,
        )
        if args.vllm_mode == "server":
            return PerRankServer.of(generation, accelerator, args.temperature)
        return generation

    return build


@dataclass(eq=False)
class PerRankServer:
    """Server mode, each rank on its own: its `VLLMClient` generates, TRL's sync pushes weights.

    TRL's `VLLMGeneration.generate` in server mode is collective (module doc); this one sends only
    this rank's prompts, with the sampling settings TRL's would send.
    """

    generation: Any
    """TRL's `VLLMGeneration` in server mode: `sync_weights` and the sampling settings."""
    client: Any
    """This rank's `VLLMClient` (the main process's is the generation's, with the communicator)."""
    logprobs_mode: str = "processed"
    max_model_length: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    max_completion_length: int = 16
    generation_kwargs: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, generation: Any, accelerator: Any, temperature: float) -> PerRankServer:
        """Open this rank's client and read the server's logprobs mode and context length.

        Raises:
            ValueError: the server's logprobs are not those of the sampling distribution.

        """
        client = generation.vllm_client if accelerator.is_main_process else rank_client(generation)
        config = client.get_server_info()["model_config"]
        mode = SERVER_LOGPROBS.get(config.get("logprobs_mode"))
        if mode is None or (mode == "raw" and temperature != 1.0):
            raise ValueError(
                f"the vLLM server at {client.base_url} runs --logprobs-mode "
                f"{config.get('logprobs_mode')}: its logprobs are not those of the distribution "
                f"sampled at temperature {temperature}; restart it with --logprobs-mode "
                "processed_logprobs"
            )
        return cls(generation, client, mode, config.get("max_model_len"))

    def generate(
        self,
        prompts: list[list[int]],
        images: list[list[Any] | None] | None,
        num_generations: int,
        profiler: Any = None,
    ) -> tuple[Any, ...]:
        """Generate this rank's prompts on the server; no other rank takes part.

        Raises:
            ValueError: images were given (planner prompts are text).

        """
        if images is not None:
            raise ValueError("the planner's prompts are text: no images")
        trl = self.generation
        out = self.client.generate(
            prompts=prompts,
            n=num_generations,
            repetition_penalty=trl.repetition_penalty,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=trl.top_k,
            min_p=trl.min_p or 0.0,
            max_tokens=self.max_completion_length,
            logprobs=trl.logprobs,
            structured_outputs_regex=trl.structured_outputs_regex,
            generation_kwargs=self.generation_kwargs,
        )
        prompt_ids = [ids for ids in out["prompt_ids"] for _ in range(num_generations)]
        return prompt_ids, out["completion_ids"], out["logprobs"], out.get("logprob_token_ids")

    def sync_weights(self) -> None:
        """Push the weights with TRL's `sync_weights` (every rank calls it, at the same point)."""
        self.generation.sync_weights()


def rank_client(generation: Any) -> Any:
    """Open a `VLLMClient` of this rank to the generation's server, without a communicator."""
    url = generation.server_base_url or f"http://{generation.server_host}:{generation.server_port}"
    return VLLMClient(
        base_url=url, group_port=generation.group_port, connection_timeout=generation.server_timeout
    )


@dataclass(eq=False)
class VLLMRollouts:
    """The trainer's vLLM side: weights synced once per step, a batching policy per step."""

    engine: VLLMEngine
    """TRL's `VLLMGeneration` (colocate), a `PerRankServer` (server), or a stand-in."""
    concurrency: int | None = None
    """Rollouts in flight at once: the most planner calls one generate takes. None: the
    step's rollouts on this process (per_device_train_batch_size x steps_per_generation)."""
    context_window: int | None = None
    """The most tokens prompt plus completion may take in the engine."""
    synced_step: int = -1
    """The optimizer step whose weights the engine holds (-1: none pushed yet)."""
    syncs: int = 0
    """How many times weights were pushed."""

    def policy(self, trainer: Any, version: str) -> VLLMPolicy:
        """Sync the weights if an optimizer step came since the last sync; return the policy."""
        step = trainer.state.global_step
        if step != self.synced_step:
            self.engine.sync_weights()
            trainer.accelerator.wait_for_everyone()  # no rank samples before the weights are in
            self.synced_step, self.syncs = step, self.syncs + 1
        return VLLMPolicy(
            self.engine,
            trainer.processing_class,
            version,
            max_batch_size=self.concurrency
            or trainer.args.per_device_train_batch_size * trainer.args.steps_per_generation,
            logprobs_mode=getattr(self.engine, "logprobs_mode", "processed"),
            context_window=self.context_window,
        )

    def recompute_old_logps(self, trainer: Any, tensors: dict[str, Any]) -> None:
        """Take the old logprobs from a training forward; add TRL's ratio to vLLM's if asked."""
        sampled = tensors["old_per_token_logps"]
        recompute_old_logps(trainer, tensors)
        if trainer.vllm_importance_sampling_correction:  # TRL's loss multiplies by it
            tensors["importance_sampling_ratio"] = importance_ratio(
                trainer, sampled, tensors["old_per_token_logps"], tensors["completion_mask"]
            )


def attach_vllm(trainer: Any, factory: VLLMFactory | None) -> VLLMRollouts | None:
    """Build the trainer's vLLM engine under `args.use_vllm` (None without it).

    TRL's loss then weighs by TRL's importance-sampling ratio (`trainer.use_vllm`), whose old
    logprobs come from a training forward, as in TRL (`recompute_old_logprobs`).

    Raises:
        ValueError: a factory without use_vllm, an offline trainer, a LoRA model, or engine
            settings under which generate would need the other ranks.

    """
    args = trainer.args
    if not args.use_vllm:
        if factory is not None:
            raise ValueError("a vLLM engine factory was given but use_vllm is off; set use_vllm")
        return None
    check_vllm_engine(args)
    if not isinstance(trainer.source, Rollouts):
        raise ValueError("use_vllm generates rollouts, and offline training has none; turn it off")
    if is_peft_model(trainer.model):
        raise ValueError(f"the model is a LoRA (PEFT) model: {LORA_PATH}")
    engine = (factory or trl_factory(args))(
        trainer.model, trainer.accelerator, trainer.processing_class
    )
    trainer.use_vllm, trainer.vllm_generation = True, engine
    if trainer.vllm_importance_sampling_correction:
        trainer.recompute_old_logprobs = True  # the ratio's old policy is the training forward
    window = getattr(engine, "max_model_length", None)
    return VLLMRollouts(
        engine,
        concurrency=trainer.source.concurrency,
        context_window=window or getattr(trainer.model.config, "max_position_embeddings", None),
    )
