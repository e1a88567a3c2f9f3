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

Nothing the server sends is trusted. Every call has a total deadline (the policy's `timeout_s`,
or less when the call's `Sampling.deadline`, the run's remaining budget, comes sooner) and a
cap on the reply's size (`max_response_bytes`); a reply that is not JSON, has no usable choice,
or holds ids outside the tokenizer's vocabulary or logprobs that are not log-probabilities is
refused. Each of these raises `ServerReplyError`, naming the server and what was wrong, which
is never retried (`nodes.retry.is_transient`) and which the nodes record as the call's engine
error.
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path
from typing import Any, Literal

from flowlearn.engine.local import chat_prompt_ids
from flowlearn.engine.sampling import (
    CALL_DEADLINE,
    Generation,
    Messages,
    Sampling,
    token_problem,
)
from flowlearn.engine.stops import StopWatch, watch_completion
from flowlearn.errors import ServerError, ServerReplyError
from flowlearn.secrets import redact, remember, url_secrets

LogprobsMode = Literal["processed", "raw"]

MAX_RESPONSE_BYTES = 64 * 2**20
"""The default cap on one reply's body, 64 MiB. The longest call's reply (131,072 tokens, each
with its id and logprob, about 200 bytes apiece in the chat format) is about 26 MiB."""


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
        max_response_bytes: int = MAX_RESPONSE_BYTES,
        version: str | None = None,
        vocab_size: int | None = None,
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
            timeout_s: seconds one call may take in all, from sending the request to the
                reply's last byte; a call's `Sampling.deadline` may make it shorter.
            max_response_bytes: the most bytes a reply's body may hold; a longer one is refused
                as it arrives, never read whole.
            version: the policy version recorded with every call (default: the model name).
            vocab_size: the served model's vocabulary, its embedding rows, which every returned
                id must be below. It may exceed the tokenizer's length (Qwen2.5 pads 151,665
                tokens to 152,064 rows, and a model may sample a padded id). Default: the
                larger of the tokenizer's length and the `vocab_size` in the `config.json`
                beside a tokenizer loaded from a folder.

        Raises:
            ValueError: a base URL that is not http(s), an unknown logprobs mode, a timeout
                that is not a positive number of seconds, or a size cap below 1 KiB.

        """
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(
                f"base_url must start with http:// or https://, got {redact(base_url)!r}"
            )
        if logprobs_mode not in ("processed", "raw"):
            raise ValueError(f"logprobs_mode must be 'processed' or 'raw', got {logprobs_mode!r}")
        if not isinstance(timeout_s, int | float) or not 0 < timeout_s < math.inf:
            raise ValueError(f"timeout_s must be a positive number of seconds, got {timeout_s!r}")
        if not isinstance(max_response_bytes, int) or max_response_bytes < 1024:
            raise ValueError(
                f"max_response_bytes must be a whole number >= 1024, got {max_response_bytes!r}"
            )
        import httpx

        key = os.environ.get(api_key_env) if api_key_env else None
        remember(key, *url_secrets(base_url))  # never in an error text: a 401 may echo it
        # no compression: a compressed reply's size says nothing of what it expands to
        headers = {"Accept-Encoding": "identity"}
        if key:
            headers["Authorization"] = f"Bearer {key}"
        root = base_url.rstrip("/")
        self._client = httpx.Client(base_url=root, headers=headers, timeout=timeout_s)
        self.url = redact(root)
        """The base URL with any secret in it redacted: safe to print."""
        self.model = model
        self.tokenizer = tokenizer
        if vocab_size is None and tokenizer is not None:
            vocab_size = max(len(tokenizer), configured_vocab(tokenizer))
        self.vocab_size: int | None = vocab_size
        """The model's vocabulary size, which every returned id must be below; None when no
        tokenizer or size is given (ids are then only checked to be whole numbers >= 0)."""
        self.logprobs_mode = logprobs_mode
        self.timeout_s = float(timeout_s)
        self.max_response_bytes = max_response_bytes
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

        Raises:
            ServerError: the server answered with an error status (429 and 5xx are transient).
            ServerReplyError: no reply within the call's deadline (`timeout_s`, or the
                run's remaining budget in `sampling.deadline`), a reply over
                `max_response_bytes`, or one that is malformed or holds ids or logprobs the
                model could not have sampled; the message says which.

        """
        seconds, limit = self._time_left(sampling)
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
        status, raw = self._exchange(route, body, seconds, limit)
        elapsed = time.perf_counter() - start
        if status >= 400:
            text = raw[:500].decode("utf-8", errors="replace")
            raise ServerError(status, redact(text), url=self.url)
        try:
            data = _json_reply(raw)
            choice = _first_choice(data)
            text = _choice_text(choice)
            sent = choice.get("prompt_token_ids") or data.get("prompt_token_ids")
            prompt_ids = sent if sent is not None else prompt_ids
            completion_ids, logprobs = _tokens_and_logprobs(choice)
            problem = token_problem(
                {"prompt_ids": prompt_ids, "completion_ids": completion_ids, "logprobs": logprobs},
                self.vocab_size,
            )
            if problem is not None:
                raise _Malformed(
                    f"{problem}; the model could not have sampled it: check that the server "
                    "serves the model whose tokenizer is given here"
                )
        except _Malformed as exc:
            raise ServerReplyError(
                f"the generation server at {self.url} sent a reply that cannot be used: {exc}"
            ) from None
        if stopping is not None and completion_ids is not None:
            completion_ids, logprobs, text = watch_completion(stopping, completion_ids, logprobs)
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
            prompt_ids=list(prompt_ids) if prompt_ids is not None else None,
            completion_ids=completion_ids,
            logprobs=[float(x) for x in logprobs] if logprobs is not None else None,
            policy_version=self.version,
            # what the logprobs describe, so training can refuse processed ones under top-p < 1
            sampling={**sampling.as_dict(), "logprobs_mode": self.logprobs_mode},
            seconds=elapsed,
            notes=notes,
        )

    def close(self) -> None:
        """Close the HTTP connection pool."""
        self._client.close()

    def _time_left(self, sampling: Sampling) -> tuple[float, str]:
        """Return the call's seconds and what set them: `timeout_s` or the run's budget.

        Raises:
            ServerReplyError: the run's deadline has already passed; nothing is sent.

        """
        deadline = sampling.deadline if sampling.deadline is not None else CALL_DEADLINE.get()
        if deadline is None:
            return self.timeout_s, "the policy's timeout_s"
        left = deadline - time.time()
        if left <= 0:
            raise ServerReplyError(
                f"no time was left in the run's budget (max_seconds) for a call to the "
                f"generation server at {self.url}; give the run more time"
            )
        if left < self.timeout_s:
            return left, "the run's remaining max_seconds"
        return self.timeout_s, "the policy's timeout_s"

    def _exchange(
        self, route: str, body: dict[str, Any], seconds: float, limit: str
    ) -> tuple[int, bytes]:
        """POST `body` and return the reply's status and body, within `seconds` in all.

        httpx's timeout bounds each read, not the call: a server sending a byte a second, or
        its headers that slowly, never trips it. So the request runs on a worker thread and the
        caller waits for it at most `seconds`; a worker left behind stops at its next chunk
        (or at httpx's own timeout, a second later), its reply unread.

        Raises:
            ServerReplyError: no whole reply within `seconds`, or one over the size cap.

        """
        reply: Future[tuple[int, bytes]] = Future()
        abandoned = threading.Event()

        def work() -> None:
            try:
                reply.set_result(self._read(route, body, seconds + 1.0, abandoned))
            except BaseException as exc:  # handed to the caller, if it still waits
                reply.set_exception(exc)

        threading.Thread(target=work, name="flowlearn-server-call", daemon=True).start()
        try:
            return reply.result(timeout=seconds)
        except FutureTimeout:
            abandoned.set()
            raise ServerReplyError(
                f"the generation server at {self.url} sent no whole reply within {seconds:.1f} s "
                f"({limit}); the call was abandoned. Check that the server is up and not "
                "overloaded, or allow more time"
            ) from None

    def _read(
        self, route: str, body: dict[str, Any], seconds: float, abandoned: threading.Event
    ) -> tuple[int, bytes]:
        """Stream the reply's body in, refusing it once it passes `max_response_bytes`."""
        import httpx

        cap = self.max_response_bytes
        try:
            with self._client.stream("POST", route, json=body, timeout=seconds) as response:
                declared = response.headers.get("content-length", "")
                if declared.isdigit() and int(declared) > cap:
                    raise self._too_large(f"declares {int(declared)} bytes")
                encoding = response.headers.get("content-encoding", "identity").lower()
                if encoding not in ("", "identity"):
                    raise ServerReplyError(
                        f"the generation server at {self.url} sent its reply compressed "
                        f"(Content-Encoding: {encoding[:40]}) though asked for none; its size "
                        "could not be bounded. Serve it without compression"
                    )
                chunks: list[bytes] = []
                size = 0
                for chunk in response.iter_raw():
                    if abandoned.is_set():  # the caller gave up: stop reading
                        return response.status_code, b""
                    size += len(chunk)
                    if size > cap:
                        raise self._too_large(f"ran past {cap} bytes")
                    chunks.append(chunk)
                return response.status_code, b"".join(chunks)
        except httpx.TimeoutException as exc:  # the whole call's time, spent: not transient
            raise ServerReplyError(
                f"the generation server at {self.url} did not answer in time ({exc}); check "
                "that it is up and not overloaded"
            ) from None
        except httpx.ProtocolError as exc:
            raise ServerReplyError(
                f"the generation server at {self.url} did not answer in HTTP ({exc}); check "
                "that the URL is the server's OpenAI base (e.g. http://127.0.0.1:8000/v1)"
            ) from None

    def _too_large(self, how: str) -> ServerReplyError:
        return ServerReplyError(
            f"the generation server at {self.url} sent a reply that {how}, over the policy's "
            f"max_response_bytes ({self.max_response_bytes}); it was refused unread. A "
            "completion is far smaller: check that the URL is the server's OpenAI base (/v1)"
        )


class _Malformed(ValueError):
    """What is wrong with a reply's content; `generate` names the server around it."""


def _json_reply(raw: bytes) -> dict[str, Any]:
    """Parse the reply's body as a JSON object, or say what it is instead."""
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        head = raw[:200].decode("utf-8", errors="replace")
        what = "an HTML page" if head.lstrip().startswith("<") else f"not JSON ({exc})"
        shown = " ".join(redact(head).split())[:120]
        raise _Malformed(
            f"it is {what}, starting {shown!r}; check that the URL is the server's OpenAI "
            "base (e.g. http://127.0.0.1:8000/v1)"
        ) from None
    if not isinstance(data, dict):
        raise _Malformed(f"it is a JSON {type(data).__name__}, not an object")
    return data


def _first_choice(data: dict[str, Any]) -> dict[str, Any]:
    """Return the reply's first choice, or say why there is none."""
    choices = data.get("choices")
    if not isinstance(choices, list):
        raise _Malformed(f"`choices` is {_kind(choices)}, not a list")
    if not choices:
        raise _Malformed("`choices` is empty: the server generated nothing")
    choice = choices[0]
    if not isinstance(choice, dict):
        raise _Malformed(f"`choices[0]` is {_kind(choice)}, not an object")
    return choice


def _choice_text(choice: dict[str, Any]) -> str:
    """Return the choice's text: a completion's `text`, or a chat message's `content`."""
    if "text" in choice:
        text = choice["text"]
        if not isinstance(text, str):
            raise _Malformed(f"`choices[0].text` is {_kind(text)}, not a string")
        return text
    message = choice.get("message")
    if not isinstance(message, dict):
        raise _Malformed(f"`choices[0]` has no `text` and its `message` is {_kind(message)}")
    content = message.get("content")
    if content is not None and not isinstance(content, str):
        raise _Malformed(f"`choices[0].message.content` is {_kind(content)}, not a string")
    return content or ""


def _kind(value: Any) -> str:
    """Name a JSON value's type for a message: `missing`, `a str`, `a list`, ..."""
    return "missing" if value is None else f"a {type(value).__name__}"


def configured_vocab(tokenizer: Any) -> int:
    """Return the `vocab_size` in the `config.json` beside a tokenizer's folder, else 0.

    Read from the file only: a hub id is not looked up (no network call for a check).
    """
    config = Path(str(getattr(tokenizer, "name_or_path", "") or "")) / "config.json"
    try:
        size = json.loads(config.read_text(encoding="utf-8")).get("vocab_size")
    except (OSError, ValueError, AttributeError):
        return 0
    return size if isinstance(size, int) and not isinstance(size, bool) and size > 0 else 0


def _tokens_and_logprobs(choice: dict[str, Any]) -> tuple[Any, Any]:
    """Read the sampled ids and their logprobs from a completions or chat choice.

    They come back as sent, to be checked by `token_problem`: a string id or logprob is an
    error, never converted.
    """
    info = choice.get("logprobs") or {}
    if not isinstance(info, dict):
        raise _Malformed(f"`choices[0].logprobs` is {_kind(info)}, not an object")
    if "content" in info:  # chat: one entry per sampled token
        entries = info["content"] or []
        if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
            raise _Malformed("`choices[0].logprobs.content` is not a list of objects")
        tokens = [e.get("token", "") for e in entries]
        logprobs: Any = [e.get("logprob") for e in entries]
    else:  # completions: parallel lists
        tokens = info.get("tokens") or []
        if not isinstance(tokens, list):
            raise _Malformed(f"`choices[0].logprobs.tokens` is {_kind(tokens)}, not a list")
        logprobs = info.get("token_logprobs")
    ids = choice.get("token_ids")
    if ids is None and tokens and all(str(t).startswith("token_id:") for t in tokens):
        ids = [_token_id(str(t)) for t in tokens]  # return_tokens_as_token_ids
    return ids, logprobs


def _token_id(token: str) -> int:
    """Read `token_id:123` (vLLM's `return_tokens_as_token_ids`)."""
    digits = token.split(":", 1)[1]
    if not digits.isascii() or not digits.lstrip("-").isdigit() or len(digits) > 20:
        raise _Malformed(f"token {token[:40]!r} names no token id")
    return int(digits)
