"""Fill the page template: one self-contained HTML file, scripts and styles inline.

A report carries its document inline and may fetch nothing (its Content-Security-Policy
allows no connection at all: it opens from a ticket attachment, offline). The status page
carries only where to fetch the document (``/api/v1/series``, same origin) and how often.
Scripts run only if their hash is the one computed here, so an injected script cannot.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import html
import json
from collections.abc import Mapping, Sequence
from importlib import resources
from string import Template
from typing import Any

from vllm_triage import __version__
from vllm_triage.core.shown import one_line
from vllm_triage.errors import ConfigError

UPLOT_VERSION = "1.6.32"
ASSET_NAMES = (
    "page.html",
    "page.js",
    "page.css",
    "vendor/uPlot.iife.min.js",
    "vendor/uPlot.min.css",
    "vendor/LICENSE.uPlot",
)


@functools.cache
def asset(name: str) -> str:
    try:
        return (
            resources.files("vllm_triage.page").joinpath("assets", name).read_text(encoding="utf-8")
        )
    except OSError as exc:
        raise ConfigError(
            f"daemon/vllm_triage/page/assets/{name}: missing ({exc}); reinstall vllm-triage"
        ) from exc


def _hash(script: str) -> str:
    digest = hashlib.sha256(script.encode("utf-8")).digest()
    return f"'sha256-{base64.b64encode(digest).decode('ascii')}'"


def content_security_policy(*, live: bool) -> str:
    """No network for a report; the page's own origin only for the status page."""
    scripts = " ".join(_hash(asset(n)) for n in ("vendor/uPlot.iife.min.js", "page.js"))
    connect = "'self'" if live else "'none'"
    return (
        f"default-src 'none'; script-src {scripts}; style-src 'unsafe-inline'; "
        f"img-src data:; connect-src {connect}; base-uri 'none'; form-action 'none'"
    )


def json_for_html(document: Mapping[str, Any]) -> str:
    """JSON that cannot end its <script> element early, whatever strings it holds."""
    text = json.dumps(document, separators=(",", ":"), allow_nan=False, ensure_ascii=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def render_page(
    document: Mapping[str, Any], *, title: str, live: bool = False, waiting_html: str = ""
) -> str:
    """The page with ``document`` inline: a report's data, or the status page's source.
    ``waiting_html`` shows until the script has drawn (and stays without JavaScript)."""
    return Template(asset("page.html")).substitute(
        csp=html.escape(content_security_policy(live=live)),
        version=html.escape(__version__),
        uplot_version=UPLOT_VERSION,
        title=html.escape(one_line(title)),
        waiting=waiting_html or "<p>Drawing the report…</p>",
        uplot_css=asset("vendor/uPlot.min.css"),
        page_css=asset("page.css"),
        data=json_for_html(document),
        uplot_js=asset("vendor/uPlot.iife.min.js"),
        page_js=asset("page.js"),
    )


def status_page(
    *,
    source: str,
    refresh_seconds: float,
    routes: Sequence[str] = (),
    title: str = "vllm-triage",
) -> str:
    """The live status page: the template, told where to fetch its document. ``routes``
    are listed as links while it loads (and for a reader without JavaScript)."""
    boot = {"mode": "live", "source": source, "refresh_seconds": refresh_seconds}
    links = " ".join(f'<a href="{html.escape(r.lstrip("/"))}">{html.escape(r)}</a>' for r in routes)
    waiting = f'<p>Loading the status of every target…</p><nav class="vt-links">{links}</nav>'
    return render_page(boot, title=title, live=True, waiting_html=waiting)
