"""The `wikipedia_search` tool: search Wikipedia and return page summaries.

It talks to the MediaWiki API directly: the `wikipedia` package keeps its endpoint and
User-Agent in module globals, so two tools with different endpoints (or a test server) could not
coexist in one process.
"""

from __future__ import annotations

from typing import Any

from langchain_core.tools import BaseTool, StructuredTool, ToolException

from flowlearn.nodes.retry import with_retries
from flowlearn.secrets import error_text, remember, url_secrets

DEFAULT_ENDPOINT = "https://en.wikipedia.org/w/api.php"
USER_AGENT = "flowlearn/0.1 (agent research framework; https://pypi.org/project/flowlearn/)"


class _Transient(Exception):
    pass


def wikipedia_tool(
    *,
    endpoint: str | None = None,
    k: int = 3,
    timeout: float = 15.0,
    retries: int = 2,
    backoff: float = 0.5,
    user_agent: str = USER_AGENT,
) -> BaseTool:
    """Return `wikipedia_search`: the top `k` pages for a query, each with its intro summary.

    Args:
        endpoint: the MediaWiki `api.php` URL; defaults to English Wikipedia. A key or a
            password in it (`?apikey=...`, `user:pass@host`) never shows in an error.
        k: pages per query.
        timeout: seconds per HTTP request.
        retries: extra attempts after a 429, 5xx, timeout or connection error.
        backoff: seconds before the first retry, doubling after each.
        user_agent: sent with every request, as Wikimedia's policy asks.

    """
    import requests

    url = endpoint or DEFAULT_ENDPOINT
    remember(*url_secrets(url))  # see flowlearn.secrets
    session = requests.Session()
    session.headers["User-Agent"] = user_agent

    def get_once(params: dict[str, Any]) -> dict[str, Any]:
        try:
            response = session.get(url, params={**params, "format": "json"}, timeout=timeout)
        except (requests.Timeout, requests.ConnectionError) as exc:
            raise _Transient(error_text(exc)) from exc
        if response.status_code == 429 or response.status_code >= 500:
            raise _Transient(f"HTTP {response.status_code}")
        if response.status_code != 200:
            raise ToolException(f"wikipedia search failed: HTTP {response.status_code}")
        data: dict[str, Any] = response.json()
        return data

    def get(params: dict[str, Any]) -> dict[str, Any]:
        try:
            return with_retries(
                lambda: get_once(params), transient=(_Transient,), retries=retries, backoff=backoff
            )
        except _Transient as exc:
            raise ToolException(
                f"wikipedia search failed after {retries + 1} attempts: {exc}"
            ) from exc

    def wikipedia_search(query: str) -> str:
        found = get({"action": "query", "list": "search", "srsearch": query, "srlimit": k})
        titles = [hit["title"] for hit in found.get("query", {}).get("search", [])]
        if not titles:
            return "No Wikipedia page matches the query."
        pages = (
            get(
                {
                    "action": "query",
                    "prop": "extracts",
                    "exintro": 1,
                    "explaintext": 1,
                    "redirects": 1,
                    "titles": "|".join(titles),
                }
            )
            .get("query", {})
            .get("pages", {})
        )
        return format_pages(titles, pages)

    return StructuredTool.from_function(
        wikipedia_search,
        name="wikipedia_search",
        description="Search Wikipedia and return the best-matching pages with their summaries.",
        metadata={"usage_notes": "Query with the name of an entity or topic, not a question."},
    )


def format_pages(titles: list[str], pages: dict[str, Any]) -> str:
    """Render the found titles in rank order, each with its page's intro summary."""
    summaries = {p.get("title"): p.get("extract", "") for p in pages.values()}
    return "\n\n".join(
        f"[{rank}] {title}\n{summaries.get(title) or '(no summary)'}"
        for rank, title in enumerate(titles, 1)
    )
