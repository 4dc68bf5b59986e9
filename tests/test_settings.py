"""Tests for daemon/settings.py: defaults from rules/, the user's file, the environment."""

from __future__ import annotations

from pathlib import Path

import pytest

from daemon.errors import ConfigError
from daemon.settings import load_settings


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "triage.yaml"
    p.write_text(text, encoding="utf-8")
    return p


class TestLayers:
    def test_defaults_come_from_rules(self) -> None:
        """With no file, the SLOs and thresholds are rules/defaults.yaml's."""
        s = load_settings()
        assert s.window_seconds == 60
        assert s.slo.ttft_p99_seconds == 2.0
        assert s.incident.open_after == 3

    def test_file_overrides_one_key(self, tmp_path: Path) -> None:
        """A nested key in the file overrides only itself; its siblings keep the defaults."""
        s = load_settings(
            write(tmp_path, "slo:\n  ttft_p99_seconds: 0.8\nhardware:\n  gpu: H100\n")
        )
        assert s.slo.ttft_p99_seconds == 0.8
        assert s.slo.itl_p99_seconds == 0.1
        assert s.hardware.gpu == "H100"

    def test_environment_beats_the_file(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """VLLM_TRIAGE_SLO__ITL_P99_SECONDS wins over the file, key by key."""
        monkeypatch.setenv("VLLM_TRIAGE_SLO__ITL_P99_SECONDS", "0.05")
        s = load_settings(write(tmp_path, "slo:\n  itl_p99_seconds: 0.5\n  ttft_p99_seconds: 3\n"))
        assert s.slo.itl_p99_seconds == 0.05
        assert s.slo.ttft_p99_seconds == 3

    def test_relative_config_json_is_beside_the_file(self, tmp_path: Path) -> None:
        """model.config_json is resolved against the config file's folder."""
        s = load_settings(write(tmp_path, "model:\n  config_json: cfg/config.json\n"))
        assert s.model.config_json == tmp_path / "cfg" / "config.json"


class TestErrors:
    @pytest.mark.parametrize(
        ("text", "fragment"),
        [
            pytest.param("slo:\n  ttft_p99_seconds: -1\n", "slo.ttft_p99_seconds", id="negative"),
            pytest.param("slo:\n  ttft_p99: 1\n", "slo.ttft_p99: unknown key", id="typo"),
            pytest.param(
                "thresholds:\n  stall_after_seconds: 0\n",
                "thresholds.stall_after_seconds",
                id="stall-zero",
            ),
            pytest.param("window_seconds: soon\n", "window_seconds", id="not-a-number"),
            pytest.param("- a\n- b\n", "expected a mapping", id="list"),
            pytest.param("slo: [\n", "not valid YAML", id="yaml-syntax"),
            pytest.param(
                "model:\n  parameters_billion: 8\n  config_json: x.json\n",
                "not both",
                id="two-sizes",
            ),
            pytest.param(
                "model:\n  parameters_billion: 8\n  active_parameters_billion: 9\n",
                "active_parameters_billion exceeds parameters_billion",
                id="active-above-total",
            ),
            pytest.param(
                "model:\n  kv_bytes_per_token: 0\n", "model.kv_bytes_per_token", id="kv-zero"
            ),
            pytest.param(
                "hardware:\n  compute_tflops: -1\n", "hardware.compute_tflops", id="compute"
            ),
            pytest.param(
                "thresholds:\n  roofline_impossible_ratio: 0.9\n",
                "thresholds.roofline_impossible_ratio",
                id="impossible-below-1",
            ),
        ],
    )
    def test_errors_name_the_key(self, tmp_path: Path, text: str, fragment: str) -> None:
        """Nonsense settings are a ConfigError that names the key or the problem."""
        with pytest.raises(ConfigError, match=fragment.replace("[", r"\[")):
            load_settings(write(tmp_path, text))

    def test_missing_file(self, tmp_path: Path) -> None:
        """A config path that does not exist says so, with the path."""
        with pytest.raises(ConfigError, match="cannot read"):
            load_settings(tmp_path / "nope.yaml")

    def test_empty_file_is_the_defaults(self, tmp_path: Path) -> None:
        """An empty file changes nothing."""
        assert load_settings(write(tmp_path, "")) == load_settings()
