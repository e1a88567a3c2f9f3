"""The `web_search` tool: Tavily search, returning title, url and content per result."""

from __future__ import annotations

import os
from typing import Any

from langchain_core.tools import BaseTool, StructuredTool, ToolException

from flowlearn.errors import TransientSearchError
from flowlearn.nodes.retry import with_retries
from flowlearn.secrets import error_text, redact, remember, url_secrets

KEY_ENV = "TAVILY_API_KEY"
BASE_URL_ENV = "TAVILY_BASE_URL"


def web_search_tool(
    *,
    api_key: str | None = None,
    base_url: str | None = None,
    max_results: int = 5,
    timeout: float = 20.0,
    retries: int = 2,
    backoff: float = 0.5,
) -> BaseTool:
    """Return `web_search` over Tavily (`pip install tavily-python`).

    Args:
        api_key: Tavily key; defaults to `$TAVILY_API_KEY`.
        base_url: API root; defaults to `$TAVILY_BASE_URL`, else Tavily's own (tests point it
            at a stand-in server on 127.0.0.1).
        max_results: results per query.
        timeout: seconds per HTTP request.
        retries: extra attempts after a rate limit (429), timeout, connection or 5xx error.
        backoff: seconds before the first retry, doubling after each.

    Raises:
        ValueError: no API key, naming the variable to set.
        ImportError: tavily-python is not installed, with the command that installs it.

    Errors never show the key or a secret in `base_url` (Tavily's 403 echoes the key).

    """
    key = api_key or os.environ.get(KEY_ENV)
    if not key:
        raise ValueError(
            f"web_search needs a Tavily API key: set {KEY_ENV} (or pass api_key=...), "
            "or leave web search off"
        )
    try:
        import requests
        from tavily import TavilyClient, errors
    except ImportError as exc:
        raise ImportError("web_search needs tavily-python: pip install 'flowlearn[web]'") from exc
    root = base_url or os.environ.get(BASE_URL_ENV)
    remember(key, *url_secrets(root))  # see flowlearn.secrets
    client = TavilyClient(api_key=key, api_base_url=root)

    def search_once(query: str) -> dict[str, Any]:
        try:
            data: dict[str, Any] = client.search(query, max_results=max_results, timeout=timeout)
            return data
        except (errors.UsageLimitExceededError, errors.TimeoutError) as exc:
            raise TransientSearchError(error_text(exc)) from exc
        except requests.ConnectionError as exc:
            raise TransientSearchError(f"connection failed: {redact(str(exc))}") from exc
        except requests.HTTPError as exc:
            status = exc.response.status_code if exc.response is not None else 0
            if status >= 500:
                raise TransientSearchError(f"server error (HTTP {status})") from exc
            raise ToolException(f"web search failed: HTTP {status}") from exc
        except errors.InvalidAPIKeyError as exc:
            raise ToolException(
                f"web search failed: invalid API key (HTTP 401); check {KEY_ENV}"
            ) from exc
        except (errors.ForbiddenError, errors.BadRequestError) as exc:
            raise ToolException(f"web search failed: {error_text(exc)}") from exc

    def web_search(query: str) -> str:
        try:
            data = with_retries(
                lambda: search_once(query),
                transient=(TransientSearchError,),
                retries=retries,
                backoff=backoff,
            )
        except TransientSearchError as exc:
            raise ToolException(f"web search failed after {retries + 1} attempts: {exc}") from exc
        return format_results(data)

    return StructuredTool.from_function(
        web_search,
        name="web_search",
        description="Search the web and return the top results with title, URL and content.",
        metadata={"usage_notes": "Use specific keyword queries; results may be noisy or stale."},
    )


def format_results(data: dict[str, Any]) -> str:
    """Render Tavily's results as numbered blocks of title, URL and content."""
    results = data.get("results") or []
    if not isinstance(results, list) or not results:
        return "No results."
    return "\n\n".join(
        f"[{rank}] {r.get('title', '')}\nURL: {r.get('url', '')}\n{r.get('content', '')}"
        for rank, r in enumerate(results, 1)
        if isinstance(r, dict)
    )
