"""Settings errors come in one pass: misspelt keys, unknown variables and bad values
(a field's own, and the checks across fields that pydantic runs only once every field is
valid) are all told together, so fixing the file takes one round, not several."""

from __future__ import annotations

from pathlib import Path

import pytest

from vllm_triage.config.load import load_settings
from vllm_triage.errors import ConfigError


def refused(tmp_path: Path, text: str) -> str:
    p = tmp_path / "triage.yaml"
    p.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load_settings(p)
    return str(info.value)


def test_a_misspelt_key_and_a_cross_field_error_are_told_together(tmp_path: Path) -> None:
    """The window shorter than the interval is a model-level check: before, it was
    only said once the misspelt key was fixed."""
    said = refused(tmp_path, "intervall_seconds: 5\ninterval_seconds: 5\nwindow_seconds: 1\n")
    assert "intervall_seconds: unknown key; did you mean interval_seconds?" in said
    assert "window_seconds (1) is shorter than interval_seconds (5)" in said


def test_misspelt_keys_in_a_list_and_repeated_names_are_told_together(tmp_path: Path) -> None:
    said = refused(
        tmp_path,
        "targets:\n"
        "  - {name: a, url: 'http://127.0.0.1:1/metrics', scrape_timout: 3}\n"
        "  - {name: a, url: 'http://127.0.0.1:2/metrics'}\n",
    )
    assert "targets.0.scrape_timout: unknown key" in said
    assert "targets: names must be unique, repeated: a" in said


def test_an_unknown_variable_and_a_bad_value_are_told_together(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VLLM_TRIAGE_INTERVAL_SECOND", "2")
    said = refused(tmp_path, "slo:\n  itl_p99_seconds: -1\n")
    assert "VLLM_TRIAGE_INTERVAL_SECOND: unknown variable" in said
    assert "slo.itl_p99_seconds: Input should be greater than 0" in said


def test_each_error_is_said_once(tmp_path: Path) -> None:
    """The second validation (without the unknown keys) repeats the field errors the
    first one found; they are listed once."""
    said = refused(tmp_path, "slo:\n  ttft_p99_secondz: 2\n  itl_p99_seconds: -1\n")
    assert said.count("slo.itl_p99_seconds") == 1
    assert "slo.ttft_p99_secondz: unknown key" in said


def test_a_valid_file_still_loads(tmp_path: Path) -> None:
    p = tmp_path / "ok.yaml"
    p.write_text("interval_seconds: 5\nwindow_seconds: 60\n", encoding="utf-8")
    assert load_settings(p).window_seconds == 60
