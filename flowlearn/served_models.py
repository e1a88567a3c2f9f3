"""The flow's models on an OpenAI-compatible server (vLLM): the planner, the engine, or both.

The planner at `--planner-url` is a `ServerPolicy`; the engine at `--engine-url` is a
`ServerChatModel` over one. Each is named by the model the server serves (`--planner`,
`--engine`), and that name must also load the model's tokenizer here (a local folder, as
`vllm serve /models/X` serves it under `/models/X`, or a hub id in the local cache): prompts are
rendered here and sent as token ids, so what the model read is exactly what is logged.
"""

from __future__ import annotations

from typing import Any

from flowlearn.nodes.policies import ServerChatModel, ServerPolicy
from flowlearn.nodes.prompts import Budgets


class ServedNameError(ValueError):
    """A served model whose name cannot be used here; the message says what to give."""


def served_tokenizer(name: str) -> Any:
    """Load the tokenizer of the served model `name`, or return None when none loads here."""
    try:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(name)
    except (OSError, ValueError):
        return None


def server_planner(url: str, model: str) -> ServerPolicy:
    """Return the planner on the server at `url`, serving `model`.

    When the model's tokenizer loads here, the chat template is applied here and prompts go to
    the server as token ids; otherwise the server renders them. Either way the transitions
    carry the ids the server returns.
    """
    return ServerPolicy(url, model, tokenizer=served_tokenizer(model))


def server_engine(
    url: str,
    model: str | None,
    *,
    fixed_max_new_tokens: int | None = None,
    max_new_tokens: int = Budgets().engine,
) -> ServerChatModel:
    """Return the fixed engine on the server at `url`, serving `model`.

    Raises:
        ServedNameError: no model named, or one whose tokenizer does not load here.

    """
    if not model or model in {"default", "base"}:
        raise ServedNameError(
            f"--engine-url needs --engine: the name the server at {url} serves the engine "
            f"model under (got {model!r}); serve a local folder (vllm serve /models/X) and "
            "give that path, so its tokenizer loads here too"
        )
    tokenizer = served_tokenizer(model)
    if tokenizer is None:
        raise ServedNameError(
            f"the engine {model!r} on {url}: its tokenizer does not load here, and the engine's "
            "prompts are rendered here (its chat template, the tool-call prefill); serve the "
            "model from a local folder and name that folder with --engine"
        )
    policy = ServerPolicy(url, model, tokenizer=tokenizer)
    return ServerChatModel(
        policy=policy, max_new_tokens=max_new_tokens, fixed_max_new_tokens=fixed_max_new_tokens
    )
