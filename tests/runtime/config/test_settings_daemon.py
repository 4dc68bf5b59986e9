"""Tests for the daemon's settings (daemon/vllm_triage/config/schema.py): listen, interval, targets,
receivers and alerting; flags over the environment over the file; secrets kept secret."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from vllm_triage.assemble import receiver_name
from vllm_triage.ceiling.sizing import read_config_json
from vllm_triage.config.load import load_settings
from vllm_triage.config.schema import ReceiverSettings, Settings, TargetSettings
from vllm_triage.errors import ConfigError

from support.paths import CONFIGS

LLAMA = CONFIGS / "llama-3.1-8b.json"


def write(tmp_path: Path, data: dict[str, Any] | str) -> Path:
    p = tmp_path / "triage.yaml"
    p.write_text(data if isinstance(data, str) else yaml.safe_dump(data), encoding="utf-8")
    return p


def target(name: str = "a", **kw: Any) -> dict[str, Any]:
    return {"name": name, "url": f"http://127.0.0.1:8000/{name}/metrics", **kw}


@pytest.fixture(autouse=True)
def no_triage_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Settings from the environment of whoever runs the tests do not leak in."""
    for key in list(os.environ):
        if key.upper().startswith("VLLM_TRIAGE_"):
            monkeypatch.delenv(key)


class TestDefaults:
    def test_daemon_defaults(self) -> None:
        s = load_settings()
        assert s.listen == "0.0.0.0:9468"
        assert s.interval_seconds == 5.0
        assert s.targets == [] and s.receivers == []
        assert s.alerting.severity == "warning"
        assert s.alerting.external_url is None
        assert s.scrape_timeout == 4.0

    def test_scrape_timeout(self) -> None:
        assert load_settings(flags={"interval_seconds": 60}).scrape_timeout == 10.0
        assert load_settings(flags={"scrape_timeout_seconds": 2.5}).scrape_timeout == 2.5

    def test_receiver_defaults(self) -> None:
        r = ReceiverSettings(type="slack", url="https://hooks.example/x")
        assert r.send_resolved is True
        assert r.repeat_interval_seconds == 4 * 3600
        assert r.hmac_header == "X-Vllm-Triage-Signature"
        assert r.queue_size == 1000


class TestLayers:
    def test_flags_beat_env_beat_file(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        config = write(tmp_path, {"listen": "127.0.0.1:1001", "interval_seconds": 7})
        assert load_settings(config).listen == "127.0.0.1:1001"
        monkeypatch.setenv("VLLM_TRIAGE_LISTEN", "127.0.0.1:1002")
        assert load_settings(config).listen == "127.0.0.1:1002"
        s = load_settings(config, {"listen": "127.0.0.1:1003"})
        assert s.listen == "127.0.0.1:1003"
        assert s.interval_seconds == 7  # a flag overrides only itself

    def test_env_beats_file_for_interval(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        config = write(tmp_path, {"interval_seconds": 7})
        monkeypatch.setenv("VLLM_TRIAGE_INTERVAL_SECONDS", "2.5")
        assert load_settings(config).interval_seconds == 2.5
        assert load_settings(config, {"interval_seconds": 1}).interval_seconds == 1

    def test_flag_targets_replace_the_files(self, tmp_path: Path) -> None:
        config = write(tmp_path, {"targets": [target("a"), target("b")]})
        s = load_settings(config, {"targets": [target("c")]})
        assert [t.name for t in s.targets] == ["c"]

    def test_targets_from_env_json(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """VLLM_TRIAGE_TARGETS holds a JSON list."""
        monkeypatch.setenv(
            "VLLM_TRIAGE_TARGETS",
            json.dumps([target("x", bearer_token="t"), target("y", hardware={"gpu": "L40S"})]),
        )
        s = load_settings()
        assert [t.name for t in s.targets] == ["x", "y"]
        assert s.targets[0].bearer_token is not None
        assert s.targets[0].bearer_token.get_secret_value() == "t"
        assert s.for_target(s.targets[1]).hardware.gpu == "L40S"

    def test_receivers_from_env_json(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv(
            "VLLM_TRIAGE_RECEIVERS",
            json.dumps([{"type": "slack", "url": "https://hooks.example/T/B/x"}]),
        )
        s = load_settings()
        assert [r.type for r in s.receivers] == ["slack"]
        assert re.fullmatch(r"slack-[0-9a-f]{8}", receiver_name(s, 0))

    def test_alerting_from_env_nested(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv("VLLM_TRIAGE_ALERTING__SEVERITY", "critical")
        assert load_settings().alerting.severity == "critical"


class TestTargets:
    def test_per_target_hardware_and_model(self, tmp_path: Path) -> None:
        config = write(
            tmp_path,
            {
                "hardware": {"gpu": "A10G"},
                "model": {"parameters_billion": 8},
                "targets": [
                    target("big", hardware={"gpu": "H100", "tensor_parallel_size": 2}),
                    target("moe", model={"parameters_billion": 47, "dtype": "bfloat16"}),
                    target("plain"),
                ],
            },
        )
        s = load_settings(config)
        big, moe, plain = s.targets
        assert isinstance(big, TargetSettings)
        assert s.for_target(big).hardware.gpu == "H100"
        assert s.for_target(big).hardware.tensor_parallel_size == 2
        assert s.for_target(big).model.parameters_billion == 8
        assert s.for_target(moe).hardware.gpu == "A10G"
        assert s.for_target(moe).model.parameters_billion == 47
        assert s.for_target(moe).model.dtype == "bfloat16"
        assert s.for_target(plain) == s
        # the top level is unchanged
        assert s.hardware.gpu == "A10G" and s.model.parameters_billion == 8

    def test_relative_config_json_is_beside_the_file(self, tmp_path: Path) -> None:
        """targets[i].model.config_json, relative, is read from the config file's folder."""
        folder = tmp_path / "conf"
        folder.mkdir()
        relative = os.path.relpath(LLAMA, folder)
        config = folder / "triage.yaml"
        config.write_text(
            yaml.safe_dump({"targets": [target("llama", model={"config_json": relative})]}),
            encoding="utf-8",
        )
        s = load_settings(config)
        path = s.for_target(s.targets[0]).model.config_json
        assert path is not None
        assert path.is_absolute() == config.is_absolute()
        assert path.resolve() == LLAMA.resolve()
        assert read_config_json(path)["num_hidden_layers"] == 32

    def test_absolute_config_json_is_kept(self, tmp_path: Path) -> None:
        config = write(tmp_path, {"targets": [target(model={"config_json": str(LLAMA)})]})
        s = load_settings(config)
        assert s.targets[0].model is not None
        assert s.targets[0].model.config_json == LLAMA

    def test_duplicate_target_names(self, tmp_path: Path) -> None:
        config = write(tmp_path, {"targets": [target("a"), target("b"), target("a")]})
        with pytest.raises(ConfigError, match=r"targets: names must be unique, repeated: a"):
            load_settings(config)

    def test_duplicate_receiver_names(self) -> None:
        hook = {"type": "slack", "url": "https://hooks.example/x", "name": "team"}
        with pytest.raises(ConfigError, match=r"receivers: names must be unique.*team"):
            load_settings(flags={"receivers": [hook, hook]})

    @pytest.mark.parametrize(
        ("bad", "key"),
        [
            pytest.param({"name": "a"}, "targets.0.url", id="no-url"),
            pytest.param(target("has space"), "targets.0.name", id="bad-name"),
            pytest.param(target(url="ftp://h/metrics"), "targets.0.url", id="ftp"),
            pytest.param(target(scrape="x"), "targets.0.scrape: unknown key", id="typo"),
            pytest.param(
                target(probe={"enabled": True, "timeout_seconds": 0}),
                "targets.0.probe.timeout_seconds",
                id="probe-timeout",
            ),
            pytest.param(
                target(probe={"enable": True}),
                "targets.0.probe.enable: unknown key",
                id="probe-typo",
            ),
            pytest.param(
                target(probe={"user": "two words"}), "targets.0.probe.user", id="probe-user"
            ),
            pytest.param(
                target(probe={"url": "ftp://h/v1"}), "targets.0.probe.url", id="probe-url"
            ),
        ],
    )
    def test_bad_target(self, bad: dict[str, Any], key: str) -> None:
        with pytest.raises(ConfigError, match=key):
            load_settings(flags={"targets": [bad]})

    def test_probe_per_target_off_by_default(self, tmp_path: Path) -> None:
        """A target's probe is off unless enabled; its defaults when it is."""
        cfg = tmp_path / "t.yaml"
        cfg.write_text(
            "targets:\n"
            "  - {name: a, url: 'http://127.0.0.1:8000/metrics'}\n"
            "  - {name: b, url: 'http://127.0.0.1:8001/metrics', probe: {enabled: true}}\n"
        )
        a, b = load_settings(cfg).targets
        assert a.probe.enabled is False and b.probe.enabled is True
        assert (b.probe.interval_seconds, b.probe.timeout_seconds) == (30.0, 30.0)
        assert (b.probe.model, b.probe.url, b.probe.user) == (None, None, "vllm-triage-probe")


class TestListen:
    @pytest.mark.parametrize("bad", ["9468", "localhost:99999", "localhost:http", "host:"])
    def test_bad_listen(self, tmp_path: Path, bad: str) -> None:
        with pytest.raises(ConfigError, match=r"listen: .*expected host:port"):
            load_settings(write(tmp_path, {"listen": bad}))

    def test_bad_listen_flag(self) -> None:
        with pytest.raises(ConfigError, match=r"command-line flags[\s\S]*listen"):
            load_settings(flags={"listen": "nowhere"})

    @pytest.mark.parametrize("good", ["127.0.0.1:0", "0.0.0.0:9468", "[::1]:9468", ":80"])
    def test_good_listen(self, good: str) -> None:
        assert load_settings(flags={"listen": good}).listen == good


SECRETS = {
    "bearer": "bearer-s3cret-1",
    "hmac": "hmac-s3cret-2",
    "password": "basic-s3cret-3",
    "header": "header-s3cret-4",
    "url": "url-s3cret-5",
    "target_token": "target-s3cret-6",
}


def secret_receivers() -> list[dict[str, Any]]:
    return [
        {
            "type": "alertmanager_webhook",
            "url": f"https://hooks.example/{SECRETS['url']}",
            "bearer_token": SECRETS["bearer"],
            "hmac_secret": SECRETS["hmac"],
            "headers": {"X-Api-Key": SECRETS["header"]},
        },
        {
            "type": "alertmanager",
            "url": "http://127.0.0.1:9093",
            "basic_auth": {"username": "alice", "password": SECRETS["password"]},
        },
    ]


def assert_no_secret(text: str) -> None:
    for name, value in SECRETS.items():
        assert value not in text, f"the {name} secret shows"


class TestSecrets:
    def test_not_in_dump_nor_repr(self, tmp_path: Path) -> None:
        config = write(
            tmp_path,
            {
                "targets": [target(bearer_token=SECRETS["target_token"])],
                "receivers": secret_receivers(),
            },
        )
        s = load_settings(config)
        # they are there, for whoever asks for them on purpose
        r0, r1 = s.receivers
        assert r0.bearer_token is not None
        assert r0.bearer_token.get_secret_value() == SECRETS["bearer"]
        assert r0.url.get_secret_value().endswith(SECRETS["url"])
        assert r1.basic_auth is not None
        assert r1.basic_auth.password.get_secret_value() == SECRETS["password"]
        assert r0.headers["X-Api-Key"].get_secret_value() == SECRETS["header"]
        # and nowhere else
        for text in (s.model_dump_json(), repr(s), str(s), repr(s.receivers), str(s.targets)):
            assert_no_secret(text)
        assert_no_secret(json.dumps(s.model_dump(mode="json")))

    def test_not_in_errors(self, tmp_path: Path) -> None:
        """An error elsewhere in a file full of secrets shows none of them."""
        config = write(
            tmp_path,
            {
                "listen": "nowhere",
                "targets": [target(bearer_token=SECRETS["target_token"])],
                "receivers": [*secret_receivers(), {"type": "slakc", "url": "http://h/"}],
            },
        )
        with pytest.raises(ConfigError) as err:
            load_settings(config)
        assert "listen" in str(err.value) and "receivers.2.type" in str(err.value)
        assert_no_secret(str(err.value))
        assert_no_secret(repr(err.value))
        assert err.value.__cause__ is None and err.value.__suppress_context__

    @pytest.mark.parametrize(
        "url",
        [
            f"ftp://hooks.example/{SECRETS['url']}",
            f"hooks.example/{SECRETS['url']}",
            f"https:///{SECRETS['url']}",
            f"javascript:{SECRETS['url']}",
        ],
    )
    def test_receiver_url_must_be_http_and_is_not_shown(self, url: str) -> None:
        with pytest.raises(ConfigError, match=r"receivers\.0\.url: .*http:// or https://") as err:
            load_settings(flags={"receivers": [{"type": "slack", "url": url}]})
        assert_no_secret(str(err.value))
        assert "hooks.example" not in str(err.value)

    def test_receiver_url_not_a_string_is_not_shown(self) -> None:
        with pytest.raises(ConfigError, match=r"receivers\.0\.url") as err:
            load_settings(flags={"receivers": [{"type": "slack", "url": 123456789}]})
        assert "123456789" not in str(err.value)

    def test_bearer_and_basic_refused(self) -> None:
        both = {
            "type": "alertmanager_webhook",
            "url": "https://hooks.example/x",
            "bearer_token": SECRETS["bearer"],
            "basic_auth": {"username": "alice", "password": SECRETS["password"]},
        }
        with pytest.raises(ConfigError, match=r"receivers\.0: .*not both") as err:
            load_settings(flags={"receivers": [both]})
        assert_no_secret(str(err.value))

    def test_bearer_and_basic_refused_on_a_target(self) -> None:
        both = target(
            bearer_token=SECRETS["target_token"],
            basic_auth={"username": "u", "password": SECRETS["password"]},
        )
        with pytest.raises(ConfigError, match=r"targets\.0: .*not both") as err:
            load_settings(flags={"targets": [both]})
        assert_no_secret(str(err.value))

    @pytest.mark.parametrize(
        "receiver",
        [
            pytest.param({"bearer_token": ["bearer-s3cret-1"]}, id="bearer-list"),
            pytest.param({"hmac_secret": {"v": "hmac-s3cret-2"}}, id="hmac-dict"),
            pytest.param({"headers": {"X-Api-Key": ["header-s3cret-4"]}}, id="header-list"),
            pytest.param(
                {"basic_auth": {"username": "", "password": ["basic-s3cret-3"]}}, id="basic"
            ),
        ],
    )
    def test_malformed_secrets_are_not_shown(self, receiver: dict[str, Any]) -> None:
        bad = {"type": "slack", "url": "https://hooks.example/x", **receiver}
        with pytest.raises(ConfigError, match=r"receivers\.0\.") as err:
            load_settings(flags={"receivers": [bad]})
        assert_no_secret(str(err.value))

    def test_settings_are_frozen(self) -> None:
        s = load_settings()
        with pytest.raises(ValueError, match="frozen"):
            s.listen = "127.0.0.1:1"  # type: ignore[misc]
        assert isinstance(s, Settings)


class TestFleetSettings:
    """``source: prometheus``: shards, DCGM, rules and the model table."""

    def fleet(self, tmp_path: Path, **prom: Any) -> Settings:
        return load_settings(
            write(
                tmp_path,
                {"source": "prometheus", "prometheus": {"url": "http://prom:9090", **prom}},
            )
        )

    def test_defaults(self, tmp_path: Path) -> None:
        p = self.fleet(tmp_path).prometheus
        assert p is not None
        assert (p.shard.index, p.shard.count) == (0, 1)
        assert p.dcgm.enabled and p.dcgm.join == {"namespace": "namespace", "pod": "pod"}
        assert p.dcgm.gpu_metric == "DCGM_FI_DEV_FB_USED"
        assert p.servers == [] and p.models == {}

    def test_the_shard_index_from_the_environment(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A StatefulSet passes each pod's ordinal as VLLM_TRIAGE_PROMETHEUS__SHARD__INDEX;
        the file's other prometheus keys stay."""
        monkeypatch.setenv("VLLM_TRIAGE_PROMETHEUS__SHARD__INDEX", "2")
        p = self.fleet(tmp_path, shard={"count": 3}).prometheus
        assert p is not None and p.url == "http://prom:9090"
        assert (p.shard.index, p.shard.count) == (2, 3)

    @pytest.mark.parametrize(
        ("prom", "key"),
        [
            ({"shard": {"index": 3, "count": 3}}, "prometheus.shard"),
            ({"shard": {"count": 0}}, "prometheus.shard.count"),
            ({"identity_labels": ["bad-label"]}, "prometheus.identity_labels.0"),
            ({"dcgm": {"join": {"pod": "exported pod"}}}, "prometheus.dcgm.join"),
            ({"dcgm": {"join": {}}}, "prometheus.dcgm.join"),
            ({"servers": [{"match": '{pod=~"("}'}]}, "prometheus.servers.0.match"),
            (
                {"servers": [{"match": "{}", "hardware": {"gpux": "h100"}}]},
                "prometheus.servers.0.hardware.gpux",
            ),
            (
                {"models": {"m": {"parameters_billion": -1}}},
                "prometheus.models.m.parameters_billion",
            ),
        ],
        ids=[
            "shard-index-not-below-count",
            "shard-count-0",
            "bad-identity-label",
            "dcgm-join-bad-label",
            "dcgm-join-empty",
            "bad-server-regex",
            "unknown-hardware-key",
            "negative-parameters",
        ],
    )
    def test_bad_values_name_their_key(
        self, tmp_path: Path, prom: dict[str, Any], key: str
    ) -> None:
        with pytest.raises(ConfigError) as err:
            self.fleet(tmp_path, **prom)
        assert f"  {key}" in str(err.value)


class TestServerLabels:
    """``alerting.server_labels`` and ``targets[].server_labels``: a server's identity on
    its alerts (the sidecar's from the downward API's variables)."""

    def test_from_the_downward_apis_variables(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv("VLLM_TRIAGE_ALERTING__SERVER_LABELS__NAMESPACE", "llm")
        monkeypatch.setenv("VLLM_TRIAGE_ALERTING__SERVER_LABELS__POD", "vllm-0")
        s = load_settings(flags={"targets": [{"name": "a", "url": "http://127.0.0.1:8000/"}]})
        assert s.server_labels_of(s.targets[0]) == {"namespace": "llm", "pod": "vllm-0"}

    def test_a_targets_own_go_over_them(self) -> None:
        s = load_settings(
            flags={
                "alerting": {"server_labels": {"job": "vllm", "instance": "x"}},
                "targets": [
                    {"name": "a", "url": "http://h:1/", "server_labels": {"instance": "h:1"}},
                    {"name": "b", "url": "http://h:2/", "server_labels": {"instance": "h:2"}},
                ],
            }
        )
        assert [s.server_labels_of(t) for t in s.targets] == [
            {"job": "vllm", "instance": "h:1"},
            {"job": "vllm", "instance": "h:2"},
        ]

    @pytest.mark.parametrize("name", ["target", "diagnosis", "alertname", "runtime", "shard"])
    def test_the_daemons_own_labels_are_refused(self, name: str) -> None:
        with pytest.raises(ConfigError, match=f"{name}: set by vllm-triage itself"):
            load_settings(flags={"alerting": {"server_labels": {name: "x"}}})

    def test_two_targets_under_one_identity_are_refused(self) -> None:
        targets = [{"name": n, "url": f"http://h:{i}/"} for i, n in enumerate("ab", 1)]
        with pytest.raises(ConfigError, match="targets a and b have the same server_labels"):
            load_settings(flags={"alerting": {"server_labels": {"pod": "p"}}, "targets": targets})
