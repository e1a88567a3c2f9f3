"""The planner on TRL's vLLM generation: concurrent flows' calls gathered into batched generates.

Many flows run at once (threads), each calling `generate(messages, sampling)` on the planner.
`VLLMPolicy` queues each call's prompt ids; the first waiting caller becomes the leader, lets the
other flows' calls join for `max_wait_s`, then hands every queued prompt with the same sampling to
one `generate` of the engine (TRL's `VLLMGeneration`, or `trl_vllm.PerRankServer`) and gives each
caller its own result. Calls that arrive while a batch runs form the next one. No thread of its
own: a policy left behind ends with its last caller.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from flowlearn.nodes.policies.batching import check_batching
from flowlearn.nodes.policies.hf import chat_prompt_ids
from flowlearn.nodes.schema.sampling import Generation, Messages, Sampling


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

    def generate(self, messages: Messages, sampling: Sampling) -> Generation:
        """Queue one call and return its completion once its batch is generated.

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
        return call.future.result()

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
