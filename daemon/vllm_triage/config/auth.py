"""The request headers for a target's or a receiver's ``HttpAuth`` settings.

Secrets leave their ``SecretStr`` only here, on their way into a request header.
"""

from __future__ import annotations

import base64

from vllm_triage import __version__
from vllm_triage.config.schema import HttpAuth

USER_AGENT = f"vllm-triage/{__version__}"


def auth_headers(auth: HttpAuth) -> dict[str, str]:
    headers = {"User-Agent": USER_AGENT}
    headers.update({k: v.get_secret_value() for k, v in auth.headers.items()})
    if auth.bearer_token is not None:
        headers["Authorization"] = f"Bearer {auth.bearer_token.get_secret_value()}"
    elif auth.basic_auth is not None:
        pair = f"{auth.basic_auth.username}:{auth.basic_auth.password.get_secret_value()}"
        headers["Authorization"] = "Basic " + base64.b64encode(pair.encode()).decode("ascii")
    return headers
