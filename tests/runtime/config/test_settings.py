"""Tests for daemon/vllm_triage/config/schema.py: defaults from rules/, the user's file, the
environment."""

from __future__ import annotations

from pathlib import Path

import pytest

from vllm_triage.config.load import load_settings
from vllm_triage.errors import ConfigError


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


class TestTheLikeliestMistakes:
    """Each gets a hint: the key, what was meant, and the value at most once."""

    @pytest.mark.parametrize(
        ("text", "line"),
        [
            ("recievers: []\n", "  recievers: unknown key; did you mean receivers?"),
            (
                "slo:\n  ttft_p99_secs: 1\n",
                "  slo.ttft_p99_secs: unknown key; did you mean ttft_p99_seconds?",
            ),
            (
                "targets: [{url: 'http://127.0.0.1:8000/metrics', hardwear: {gpu: h100}}]\n",
                "  targets.0.hardwear: unknown key; did you mean hardware?",
            ),
            (
                "listen: 9468\n",
                "  listen: expected host:port, e.g. 0.0.0.0:9468 (a port alone is not an address)",
            ),
        ],
        ids=["recievers", "slo-secs", "target-key", "bare-port"],
    )
    def test_a_hint(self, tmp_path: Path, text: str, line: str) -> None:
        with pytest.raises(ConfigError) as info:
            load_settings(write(tmp_path, text))
        assert line in str(info.value).splitlines()

    def test_unknown_gpu_and_dtype_in_one_list_with_the_rest(self, tmp_path: Path) -> None:
        """All wrong keys at once, each with its key, none with its value twice."""
        text = (
            "interval_seconds: -1\nhardware: {gpu: potato}\n"
            "model: {parameters_billion: 8, dtype: int3}\n"
        )
        with pytest.raises(ConfigError) as info:
            load_settings(write(tmp_path, text))
        lines = str(info.value).splitlines()[1:]
        assert [x.split(":")[0].strip() for x in lines] == [
            "hardware.gpu",
            "model.dtype",
            "interval_seconds",
        ]
        assert lines[0].startswith("  hardware.gpu: unknown GPU 'potato' (")
        assert lines[1].startswith("  model.dtype: unknown dtype 'int3'; accepted:")
        assert all(x.count("potato") + x.count("int3") <= 1 for x in lines)

    def test_yaml_errors_name_the_file_and_line(self, tmp_path: Path) -> None:
        path = write(tmp_path, "slo:\n  ttft_p99_seconds: [1\n")
        with pytest.raises(ConfigError) as info:
            load_settings(path)
        message = str(info.value)
        assert message.startswith(f"{path}: not valid YAML: line 3, column 1:")
        assert "at line 2, column 21" in message and "<unicode string>" not in message

    def test_a_target_without_a_name_is_named_as_target_names_it(self, tmp_path: Path) -> None:
        """As `run --target URL` does: host:port (and never the URL's user:password)."""
        s = load_settings(
            write(
                tmp_path,
                "targets:\n  - url: http://127.0.0.1:8000/metrics\n"
                "  - url: http://user:pw@vllm.internal:8001/metrics\n",
            )
        )
        assert [t.name for t in s.targets] == ["127.0.0.1:8000", "vllm.internal:8001"]


class TestEnvironment:
    @pytest.mark.parametrize(
        ("var", "meant"),
        [
            ("VLLM_TRIAGE_INTERVAL_SECOND", "VLLM_TRIAGE_INTERVAL_SECONDS"),
            ("VLLM_TRIAGE_SLO_TTFT_P99_SECONDS", "VLLM_TRIAGE_SLO__TTFT_P99_SECONDS"),
            ("VLLM_TRIAGE_HARDWARE__GPUS", "VLLM_TRIAGE_HARDWARE__GPU"),
        ],
    )
    def test_a_misspelt_variable_is_refused_with_a_did_you_mean(
        self, monkeypatch: pytest.MonkeyPatch, var: str, meant: str
    ) -> None:
        monkeypatch.setenv(var, "1")
        with pytest.raises(ConfigError) as info:
            load_settings()
        assert f"  {var}: unknown variable; did you mean {meant}?" in str(info.value)
        assert "=1" not in str(info.value)  # values are never shown (they may be secrets)

    def test_every_real_variable_is_accepted(self, monkeypatch: pytest.MonkeyPatch) -> None:
        for var, value in {
            "VLLM_TRIAGE_INTERVAL_SECONDS": "2",
            "VLLM_TRIAGE_SLO__TTFT_P99_SECONDS": "1.5",
            "vllm_triage_window_seconds": "30",  # read case-insensitively, as pydantic does
            "VLLM_TRIAGE_TARGETS": '[{"name": "a", "url": "http://127.0.0.1:1/metrics"}]',
            "VLLM_TRIAGE_PROMETHEUS__URL": "http://127.0.0.1:9090",
            "VLLM_TRIAGE_PROMETHEUS__HEADERS__X_API_KEY": "k",
        }.items():
            monkeypatch.setenv(var, value)
        monkeypatch.setenv("VLLM_TRIAGE_SOURCE", "scrape")
        s = load_settings()
        assert (s.interval_seconds, s.slo.ttft_p99_seconds, s.window_seconds) == (2, 1.5, 30)
