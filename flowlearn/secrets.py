"""Known secret values, removed from every error text before a run records or logs it.

1. Known values come from two places: environment variables with a secret-looking name
   (`OPENAI_API_KEY`, `HF_TOKEN`, `DB_PASSWORD`, `AUTH_HEADER`, ...), read at each redaction so a
   key set later is covered too; and values handed to constructors (a tool's `api_key=`, a
   token or password written into an endpoint URL), which those constructors `remember`.
2. The remembered values are process-wide on purpose: the code that records an error (the
   executor, the eval harness) is not the code that holds the key, and a library exception
   raised deep inside one tool can carry the key of another. They are never forgotten, since
   an exception made earlier may still be on its way to a record.
3. Values shorter than `MIN_CHARS` are ignored: redacting `true` or `8000` everywhere would
   garble messages without protecting anything.
4. Secrets nobody declared are caught by shape where the shape is unambiguous: the user-info of
   a URL (`https://user:pass@host`), secret-named query parameters (`?apikey=...`) and
   `Bearer ...` credentials.
"""

from __future__ import annotations

import os
import re
import threading
from urllib.parse import parse_qsl, quote, urlsplit

REDACTED = "[redacted]"
MIN_CHARS = 8
"""Shorter values are not treated as secrets (see the module docstring, point 3)."""

SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|(?:^|_)AUTH", re.IGNORECASE)
"""Environment variable names whose values are secrets."""

SECRET_PARAMETER = re.compile(
    r"(?:key|token|secret|sig|signature|auth)$|passw|pwd|credential|^(?:key|auth)[_-]",
    re.IGNORECASE,
)
"""URL query parameters whose values are secrets: `apikey`, `access_token`, `X-Amz-Signature`,
but not `keyword` or `author`."""
_USERINFO = re.compile(r"(?<=://)[^/\s@?#]+@")
_QUERY = re.compile(
    r"(?P<head>[?&;](?P<name>[^=&#\s?;]+)=)(?P<value>[^&#\s;'\"<>)\]}]+)", re.IGNORECASE
)
_BEARER = re.compile(r"(?P<head>\bBearer\s+)(?P<value>[A-Za-z0-9._~+/-]{8,}=*)", re.IGNORECASE)

_remembered: set[str] = set()
_lock = threading.Lock()


def remember(*values: str | None) -> None:
    """Treat `values` as secrets for the rest of the process (None and short ones are skipped)."""
    kept = {v.strip() for v in values if v and len(v.strip()) >= MIN_CHARS}
    with _lock:
        _remembered.update(kept)


def url_secrets(url: str | None) -> list[str]:
    """Return the secrets written into a URL: its user name and password, secret-named parameters.

    >>> url_secrets("https://bob:hunter2hunter2@wiki.test/w/api.php?apikey=abcd1234&lang=en")
    ['bob', 'hunter2hunter2', 'abcd1234']
    """
    if not url:
        return []
    try:
        parts = urlsplit(url)
        found = [parts.username, parts.password]
    except ValueError:  # a malformed port or bracket: nothing trustworthy to read
        return []
    found += [value for name, value in parse_qsl(parts.query) if SECRET_PARAMETER.search(name)]
    return [value for value in found if value]


def known_secrets() -> list[str]:
    """Return every known secret value, with its URL-quoted form, longest first."""
    from_env = {value for name, value in os.environ.items() if SECRET_NAME.search(name)}
    with _lock:
        values = from_env | _remembered
    kept = {v.strip() for v in values if len(v.strip()) >= MIN_CHARS}
    kept |= {quote(v, safe="") for v in kept}
    return sorted(kept, key=len, reverse=True)  # a key inside a longer one must not split it


def redact(text: str) -> str:
    """Return `text` with known secrets and secret-shaped credentials replaced by `[redacted]`.

    >>> redact("GET https://u:p4ssw0rd!@h.test/api?apikey=s3cr3t-value&q=1 failed")
    'GET https://[redacted]@h.test/api?apikey=[redacted]&q=1 failed'
    """
    for secret in known_secrets():
        text = text.replace(secret, REDACTED)
    text = _USERINFO.sub(f"{REDACTED}@", text)
    text = _QUERY.sub(_redact_parameter, text)
    return _BEARER.sub(lambda m: m["head"] + REDACTED, text)


def error_text(exc: BaseException) -> str:
    """Return `Type: message` for an exception, redacted: the form errors are recorded in."""
    return redact(f"{type(exc).__name__}: {exc}")


def _redact_parameter(match: re.Match[str]) -> str:
    if SECRET_PARAMETER.search(match["name"]) and match["value"] != REDACTED:
        return match["head"] + REDACTED
    return match[0]
