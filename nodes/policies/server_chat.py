"""The fixed engine on an OpenAI-compatible server (vLLM): `HFChatModel`'s conventions, remote.

Everything but the forward passes stays as for a local engine, so a flow behaves the same with
its engine here or there, but for the verifier's follow-up (a served engine writes it, a local
one chooses it: `scores_choices`). The model's chat template is applied here with its tokenizer
and the prompt goes to `/v1/completions` as token ids (`ServerPolicy`); tools are called by the same
JSON convention with the same prefill (`chat_tools`); stop strings travel as the request's
`stop`, and the call's `StopWatch` (stop strings, a closed tool call, a degenerate repetition)
is run over the ids the server returns, cutting them where a local decode would have stopped.

This is how one vLLM server serves both roles while training: the planner's LoRA adapter under
its own name, the engine as the base model (`--engine-url` with `--engine` naming it).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, ClassVar

from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.messages import BaseMessage
from langchain_core.outputs import ChatGenerationChunk
from pydantic import Field

from flowlearn.nodes.policies.hf_chat import HFChatModel
from flowlearn.nodes.policies.server import ServerPolicy


class ServerChatModel(HFChatModel):
    """A chat model whose completions come from a `ServerPolicy` that holds the tokenizer.

    Greedy by default, as an engine. It streams as one chunk: the server's reply is read whole,
    then cut by the call's watch, so nothing past a stop is ever shown.
    """

    policy: ServerPolicy = Field(exclude=True)  # type: ignore[assignment]
    scores_choices: ClassVar[bool] = False
    """A `choice` call is refused, so the verifier's follow-up is written (`verifier`), not chosen
    as a local engine's is. vLLM could score choices (`prompt_logprobs`) or constrain to them
    (structured outputs' `choice`); not done: no vLLM here to check its replies against."""

    def model_post_init(self, context: Any, /) -> None:
        """Refuse a server policy without the model's tokenizer.

        Raises:
            ValueError: no tokenizer: prompts could not be rendered nor replies watched here.

        """
        super().model_post_init(context)
        if self.policy.tokenizer is None:
            raise ValueError(
                f"the engine on {self.policy.url} needs its model's tokenizer here, to render "
                "its chat template and watch its replies: give ServerPolicy(tokenizer=...)"
            )

    @property
    def _llm_type(self) -> str:
        return "flowlearn-server"

    def _tokenizer(self) -> Any:
        return self.policy.tokenizer

    def _stop_ids(self) -> set[int]:
        eos = self.policy.tokenizer.eos_token_id
        return set(eos if isinstance(eos, list) else [eos])

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        chunk = self._whole_reply(messages, stop, run_manager, **kwargs)
        if run_manager and chunk.text:
            run_manager.on_llm_new_token(chunk.text, chunk=chunk)
        yield chunk
