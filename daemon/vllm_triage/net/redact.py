"""Secrets kept out of what people read: logs, the API, error messages, printed settings.

The one place that decides how a URL or a piece of config text is shown. A URL may carry
credentials in three places: its ``user:password@``, its query (``?token=...``), and, for
receivers such as Slack's incoming webhooks, its path. Targets' and the query API's URLs
are shown with the first two masked; receivers' URLs are never shown at all (see
``vllm_triage.config.schema.SecretHttpUrl``), and what a receiver's redirect points at is shown
with the configured URL's own path segments masked (``masked_location``).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qsl, quote, urljoin, urlsplit, urlunsplit

MASK = "***"
#: Query values shorter than this are shown (``?page=2``): too short to be a credential,
#: and masking them inside free text would garble it.
_MIN_SECRET_CHARS = 4
#: Text quoted from a config file or a target's answer is cut to this many characters.
MAX_QUOTED_CHARS = 200


def _netloc(host: str, port: int | None) -> str:
    host = f"[{host}]" if ":" in host else host
    return f"{host}:{port}" if port else host


def safe_url(url: str) -> str:
    """``url`` without its ``user:password@``, every query value masked; for logs, the
    API, ``check``, ``check-config`` and error messages."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return "<an unparseable URL>"
    netloc = parts.netloc
    if parts.username is not None or parts.password is not None:
        netloc = _netloc(parts.hostname or "", port)
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        query = "&".join(f"{quote(k, safe='')}={MASK}" for k, _ in pairs) or MASK
    return urlunsplit(parts._replace(netloc=netloc, query=query))[: 4 * MAX_QUOTED_CHARS]


def url_secrets(url: str) -> list[str]:
    """The parts of ``url`` that may be credentials, to scrub from free text (an HTTP
    library's error message may quote the URL it was given)."""
    found = [url]
    try:
        parts = urlsplit(url)
    except ValueError:
        return found
    if parts.password:
        found.append(parts.password)
    if parts.username and parts.password:
        found.append(f"{parts.username}:{parts.password}")
    found.extend(v for _, v in parse_qsl(parts.query, keep_blank_values=True))
    return found


def scrub(text: str, secrets: list[str]) -> str:
    """``text`` with every occurrence of each secret (longest first) masked."""
    for secret in sorted(secrets, key=len, reverse=True):
        if len(secret) >= _MIN_SECRET_CHARS:
            text = text.replace(secret, MASK)
    return text


def scrub_url(text: str, url: str) -> str:
    """``text`` with ``url`` shown as ``safe_url`` shows it, and its secrets masked."""
    return scrub(text.replace(url, safe_url(url)), url_secrets(url))


def masked_location(location: str, configured: str) -> str:
    """Where a receiver redirects, shown so that the fix can be made, without its
    secrets: ``safe_url``, with every path segment that also appears in the configured
    (secret) URL masked. The scheme, host, port and the segments that changed remain:
    enough to see an ``http`` that should be ``https``, a moved host or a missing slash.
    A relative ``location`` is read against ``configured``."""
    try:
        known = {s for s in urlsplit(configured).path.split("/") if s}
        parts = urlsplit(safe_url(urljoin(configured, location)))
    except ValueError:
        return "<an unparseable URL>"
    path = "/".join(MASK if s in known else s for s in parts.path.split("/"))
    return urlunsplit(parts._replace(path=path, fragment=""))


def masked_urls(doc: Any) -> Any:
    """A settings document (``model_dump(mode="json")``) with every ``url`` and
    ``external_url`` value shown as ``safe_url`` shows it."""
    if isinstance(doc, dict):
        return {
            k: safe_url(v)
            if k in ("url", "external_url") and isinstance(v, str)
            else masked_urls(v)
            for k, v in doc.items()
        }
    if isinstance(doc, list):
        return [masked_urls(v) for v in doc]
    return doc


def quoted(text: str, limit: int = MAX_QUOTED_CHARS) -> str:
    """``text`` cut to ``limit`` characters, for a message."""
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} characters)"
