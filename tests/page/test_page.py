"""Tests for daemon/vllm_triage/page/: the template, its vendored charting library, and what it
draws (rules/report.yaml). The page itself runs in a browser in tests/system/test_browser.py."""

from __future__ import annotations

import base64
import hashlib
import html
import json
import re

import pytest

from vllm_triage.errors import ConfigError
from vllm_triage.page import spec as spec_module
from vllm_triage.page.render import (
    ASSET_NAMES,
    UPLOT_VERSION,
    asset,
    content_security_policy,
    json_for_html,
    render_page,
    status_page,
)
from vllm_triage.page.spec import PageSpec, load_spec

from support.paths import PACKAGE

ASSETS = PACKAGE / "page" / "assets"
DATA = re.compile(r'<script id="vt-data" type="application/json">(.*?)</script>', re.S)


def inline_document(page: str) -> dict[str, object]:
    match = DATA.search(page)
    assert match is not None
    return json.loads(match.group(1))  # type: ignore[no-any-return]


class TestVendored:
    def test_the_files_are_the_ones_the_note_names(self) -> None:
        """uPlot is shipped unchanged: each file's sha256 is the one written in the note
        beside it (from the npm package), and the note names the version in use."""
        note = (ASSETS / "vendor" / "README.md").read_text(encoding="utf-8")
        assert f"uplot@{UPLOT_VERSION}" in note
        for name in ("uPlot.iife.min.js", "uPlot.min.css"):
            digest = hashlib.sha256((ASSETS / "vendor" / name).read_bytes()).hexdigest()
            assert f"`{name}` sha256 `{digest}`" in note, name

    def test_the_licence_ships_with_it(self) -> None:
        text = asset("vendor/LICENSE.uPlot")
        assert "MIT License" in text and "Leon Sorokin" in text

    def test_every_asset_is_readable_as_package_data(self) -> None:
        for name in ASSET_NAMES:
            assert asset(name).strip(), name


class TestRender:
    def test_a_report_is_one_file_that_fetches_nothing(self) -> None:
        page = render_page({"mode": "report", "sections": []}, title="t")
        meta = html.unescape(page.split('http-equiv="Content-Security-Policy" content="')[1])
        assert meta.startswith("default-src 'none';") and "connect-src 'none'" in meta
        # No external resource of any kind: everything is inline.
        assert not re.search(r"<(script|link|img|iframe)[^>]+(src|href)=", page)
        assert asset("vendor/uPlot.iife.min.js") in page and asset("page.js") in page

    def test_only_the_page_own_scripts_may_run(self) -> None:
        """The policy names the hashes of exactly the two inline scripts."""
        csp = content_security_policy(live=False)
        for name in ("vendor/uPlot.iife.min.js", "page.js"):
            digest = base64.b64encode(hashlib.sha256(asset(name).encode()).digest()).decode()
            assert f"'sha256-{digest}'" in csp
        assert "unsafe-inline" not in csp.split("script-src", 1)[1].split(";")[0]

    def test_the_status_page_may_reach_its_own_origin_only(self) -> None:
        assert "connect-src 'self'" in content_security_policy(live=True)
        page = status_page(source="api/v1/series", refresh_seconds=5, routes=["/metrics"])
        assert inline_document(page) == {
            "mode": "live",
            "source": "api/v1/series",
            "refresh_seconds": 5,
        }
        assert '<a href="metrics">/metrics</a>' in page

    def test_data_cannot_break_out_of_its_script_element(self) -> None:
        hostile = '</script><script>alert(1)</script><!-- & "'
        page = render_page({"mode": "report", "title": hostile}, title=hostile)
        assert "<script>alert(1)" not in page
        assert inline_document(page)["title"] == hostile
        assert "&lt;/script&gt;" in page.split("<title>", 1)[1].split("</title>")[0]

    def test_json_for_html_is_json(self) -> None:
        doc = {"a": "<b>&</b>", "n": [1.5, None]}
        assert json.loads(json_for_html(doc)) == doc


class TestSpec:
    def test_the_bundled_spec(self) -> None:
        spec = load_spec()
        ids = [p.id for p in spec.panels]
        assert ids == ["ttft", "itl", "requests", "kv", "preemptions", "prefill", "decode"]
        keys = spec.measured_keys
        assert "decode_roofline_ratio" in keys and "decode_ceiling_ratio" in keys
        assert not any(k.startswith(("slo.", "thresholds.")) for k in keys)
        assert set(spec.deciding) >= {"kv_pressure", "queue_bound", "prefill_bound", "decode_bound"}

    def test_a_cause_nobody_told_the_page_about_still_gets_a_colour(self) -> None:
        spec = load_spec()
        style = spec.cause_style("thermal_throttled")
        assert re.fullmatch(r"#[0-9a-f]{6}", style.color)
        assert style == spec.cause_style("thermal_throttled")  # stable
        assert style.color not in {c.color for c in spec.causes.values()}
        assert spec.cause_style("kv_pressure") == spec.causes["kv_pressure"]

    def test_a_broken_spec_is_refused_with_the_key(self, monkeypatch: pytest.MonkeyPatch) -> None:
        good = spec_module.read_bundled("report.yaml")
        bad = {
            **good,
            "panels": [
                {**good["panels"][0], "series": [{"key": "x", "label": "x", "color": "red"}]}
            ],
        }
        monkeypatch.setattr(spec_module, "read_bundled", lambda name: bad)
        spec_module.load_spec.cache_clear()
        try:
            with pytest.raises(ConfigError, match=r"rules/report.yaml: panels.0.series.0.color"):
                spec_module.load_spec()
        finally:
            spec_module.load_spec.cache_clear()

    def test_panel_ids_are_unique(self) -> None:
        good = spec_module.read_bundled("report.yaml")
        with pytest.raises(ValueError, match="unique"):
            PageSpec.model_validate({**good, "panels": good["panels"] + good["panels"][:1]})
