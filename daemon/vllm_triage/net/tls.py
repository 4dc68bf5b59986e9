"""The TLS context of a client that talks to one peer with its own trust or identity
(fleet mode's query API): the CAs it trusts, the certificate it shows. Built once, at
start-up, so a missing or unreadable file fails before anything runs, naming the file."""

from __future__ import annotations

import ssl
from pathlib import Path

from vllm_triage.errors import ConfigError


def client_context(
    *,
    ca_file: Path | None = None,
    cert_file: Path | None = None,
    key_file: Path | None = None,
    insecure_skip_verify: bool = False,
    key: str = "tls",
) -> ssl.SSLContext:
    """A client context: the system's CAs (or ``ca_file``'s), hostname checked, TLS 1.2
    at least; with ``cert_file`` (and ``key_file``) a client certificate. ``key`` names
    the settings section in errors."""
    try:
        ctx = ssl.create_default_context(cafile=str(ca_file) if ca_file is not None else None)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"{key}.ca_file: cannot read {ca_file}: {_why(exc)}") from None
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if insecure_skip_verify:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    if cert_file is not None:
        try:
            ctx.load_cert_chain(str(cert_file), str(key_file) if key_file is not None else None)
        except (OSError, ssl.SSLError) as exc:
            files = str(cert_file) + (f" and {key_file}" if key_file is not None else "")
            raise ConfigError(
                f"{key}.cert_file: cannot load the client certificate from {files}: {_why(exc)}"
            ) from None
    return ctx


def _why(exc: BaseException) -> str:
    """What went wrong, without the bytes of a file (an ``SSLError`` names only the step)."""
    if isinstance(exc, ssl.SSLError):
        return exc.reason or type(exc).__name__
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return type(exc).__name__
