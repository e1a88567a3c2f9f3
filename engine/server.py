"""A planner policy served by an OpenAI-compatible server (vLLM), token-faithful where it can be.

For users with a generation server: `vllm serve MODEL --logprobs-mode processed_logprobs`
(vLLM 0.10.2 or later). With the model's tokenizer given, the chat template is applied here and
the prompt goes to `/v1/completions` as token ids, so `prompt_ids` are exactly what the model
read; without it, `/v1/chat/completions` renders the prompt on the server. Either way the
request asks for `return_token_ids` and per-token logprobs, and the generation carries
`prompt_ids`, `completion_ids` and `logprobs` as `HFPolicy` logs them.

Where the server cannot give them (a server without `return_token_ids`, or logprobs of the raw
distribution while sampling at another temperature), the text still comes back but the ids or
logprobs are left out with a note, so training refuses the call instead of learning from
numbers that do not describe the sampling.
"""

from __future__ import annotations

import os
import time
from typing import Any, Literal

from flowlearn.engine.local import chat_prompt_ids
from flowlearn.engine.sampling import Generation, Messages, Sampling
from flowlearn.engine.stops import StopWatch
from flowlearn.errors import ServerError
from flowlearn.secrets import redact, remember, url_secrets

LogprobsMode = Literal["processed", "raw"]


class ServerPolicy:
    """Sample planner turns from an OpenAI-compatible server, logging exact tokens it returns."""

    continues_prefill = True
    """A final assistant message is continued, as the chat template renders it."""

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        tokenizer: Any = None,
        api_key_env: str | None = "OPENAI_API_KEY",
        logprobs_mode: LogprobsMode = "processed",
        timeout_s: float = 300.0,
        version: str | None = None,
    ) -> None:
        """Point the policy at a server.

        Args:
            base_url: the server's OpenAI base URL, e.g. `http://127.0.0.1:8000/v1`.
            model: the served model's name.
            tokenizer: the model's tokenizer; given, prompts are rendered here and sent as ids.
            api_key_env: the environment variable holding the server's key, if it wants one;
                read once here, sent only in the Authorization header, and redacted from
                every error text (as is a password in `base_url`).
            logprobs_mode: `processed` when the server reports logprobs after temperature and
                top-p (vLLM `--logprobs-mode processed_logprobs`), `raw` when before them.
            timeout_s: seconds one request may take.
            version: the policy version recorded with every call (default: the model name).

        Raises:
            ValueError: a base URL that is not http(s), or an unknown logprobs mode.

        """
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(
                f"base_url must start with http:// or https://, got {redact(base_url)!r}"
            )
        if logprobs_mode not in ("processed", "raw"):
            raise ValueError(f"logprobs_mode must be 'processed' or 'raw', got {logprobs_mode!r}")
        import httpx

        key = os.environ.get(api_key_env) if api_key_env else None
        remember(key, *url_secrets(base_url))  # never in an error text: a 401 may echo it
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        root = base_url.rstrip("/")
        self._client = httpx.Client(base_url=root, headers=headers, timeout=timeout_s)
        self.url = redact(root)
        """The base URL with any secret in it redacted: safe to print."""
        self.model = model
        self.tokenizer = tokenizer
        self.logprobs_mode = logprobs_mode
        self.version = version or f"{model}@server"

    def generate(
        self, messages: Messages, sampling: Sampling, *, stopping: StopWatch | None = None
    ) -> Generation:
        """Sample one completion on the server and return its text, ids and logprobs.

        A `stopping` watch (the engine's: `ServerChatModel`) sends its stop strings with the
        request, as OpenAI's `stop`, and is then run over the returned ids, so a repetition, a
        closed tool call or a stop string the server did not apply ends the completion where a
        local model would have stopped (the tokens after it are dropped, with their logprobs),
        and the text is the watch's decoding of the ids kept, as a local engine's is.
        """
        body: dict[str, Any] = {
            "model": self.model,
            "max_tokens": sampling.max_new_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "return_token_ids": True,
            "return_tokens_as_token_ids": True,
        }
        if sampling.seed is not None:
            body["seed"] = sampling.seed
        if stopping is not None and stopping.stop:
            body["stop"] = list(stopping.stop)
        prompt_ids: list[int] | None = None
        if self.tokenizer is not None:
            prompt_ids = chat_prompt_ids(self.tokenizer, messages)
            route = "/completions"
            body |= {"prompt": prompt_ids, "logprobs": 1}
        else:
            route = "/chat/completions"
            body |= {"messages": messages, "logprobs": True, "top_logprobs": 1}
            if messages and messages[-1]["role"] == "assistant":  # a prefill: continue it
                body |= {"add_generation_prompt": False, "continue_final_message": True}
        start = time.perf_counter()
        response = self._client.post(route, json=body)
        seconds = time.perf_counter() - start
        if response.status_code >= 400:
            raise ServerError(response.status_code, redact(response.text[:500]))
        data = response.json()
        choice = data["choices"][0]
        text = choice["text"] if "text" in choice else choice["message"]["content"] or ""
        prompt_ids = choice.get("prompt_token_ids") or data.get("prompt_token_ids") or prompt_ids
        completion_ids, logprobs = _tokens_and_logprobs(choice)
        if stopping is not None and completion_ids is not None:
            completion_ids, logprobs, text = _watched(stopping, completion_ids, logprobs)
        notes: list[str] = []
        if completion_ids is None or prompt_ids is None:
            notes.append(
                "the server returned no token ids (vLLM 0.10.2+ returns them with "
                "return_token_ids); this call cannot be trained on"
            )
            completion_ids = logprobs = None
        elif logprobs is None or len(logprobs) != len(completion_ids):
            notes.append("the server returned no logprob per sampled token; not trainable")
            logprobs = None
        elif self.logprobs_mode == "raw" and sampling.temperature not in (0.0, 1.0):
            notes.append(
                f"the server's logprobs are raw (temperature 1) but sampling used "
                f"{sampling.temperature}; serve with --logprobs-mode processed_logprobs"
            )
            logprobs = None
        return Generation(
            text=text,
            prompt_ids=[int(i) for i in prompt_ids] if prompt_ids is not None else None,
            completion_ids=completion_ids,
            logprobs=logprobs,
            policy_version=self.version,
            # what the logprobs describe, so training can refuse processed ones under top-p < 1
            sampling={**sampling.as_dict(), "logprobs_mode": self.logprobs_mode},
            seconds=seconds,
            notes=notes,
        )

    def close(self) -> None:
        """Close the HTTP connection pool."""
        self._client.close()


def _watched(
    watch: StopWatch, ids: list[int], logprobs: list[float] | None
) -> tuple[list[int], list[float] | None, str]:
    """Run `watch` over the returned ids as a local decode would; cut them where it fires.

    The text is the watch's decoding of the ids kept, as a local engine's is (the caller then
    cuts a stop string off it). Logprobs that do not pair one to one with the ids are dropped,
    so the check after this one says so instead of a cut pairing them by accident.
    """
    paired = logprobs if logprobs is not None and len(logprobs) == len(ids) else None
    end = next((end for end in range(1, len(ids) + 1) if watch.update(ids[:end])), len(ids))
    kept = paired[:end] if paired is not None else None
    return ids[:end], kept, watch.decode(ids[:end])


def _tokens_and_logprobs(choice: dict[str, Any]) -> tuple[list[int] | None, list[float] | None]:
    """Read the sampled ids and their logprobs from a completions or chat choice."""
    info = choice.get("logprobs") or {}
    if "content" in info:  # chat: one entry per sampled token
        entries = info["content"] or []
        tokens = [e.get("token", "") for e in entries]
        logprobs: list[float] | None = [float(e["logprob"]) for e in entries]
    else:  # completions: parallel lists
        tokens = list(info.get("tokens") or [])
        raw = info.get("token_logprobs")
        logprobs = [float(x) for x in raw] if raw is not None else None
    ids = choice.get("token_ids")
    if ids is None and tokens and all(str(t).startswith("token_id:") for t in tokens):
        ids = [int(str(t).split(":", 1)[1]) for t in tokens]  # return_tokens_as_token_ids
    return ([int(i) for i in ids] if ids is not None else None), logprobs
