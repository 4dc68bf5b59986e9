"""Secrets kept out of what people read: logs, the API, error messages."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit


def safe_url(url: str) -> str:
    """``url`` without a user:password part, for logs and the API."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit(parts._replace(netloc=netloc))
