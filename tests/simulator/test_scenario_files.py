"""Scenario files (tests for daemon/vllm_triage/simulator/scenario_files.py and rules/scenarios/).

The bundled YAML replaced presets that were Python constants; the expected values below
are those constants, written out, so that an edit to a YAML file that changes what a
scenario simulates fails here (and the recordings every other test makes stay the same).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from vllm_triage.errors import ConfigError
from vllm_triage.rules import list_bundled, read_bundled
from vllm_triage.simulator import (
    SCENARIOS,
    Phase,
    Scenario,
    ServerSpec,
    Workload,
    get_scenario,
    hold_last_phase,
    llama_8b,
    load_scenario_file,
    record,
    scenario_names,
)

from support.paths import BUNDLED_SCENARIOS, ROOT

LLAMA = "meta-llama/Llama-3.1-8B-Instruct"


def llama_on(gpu: str, bandwidth: float, tflops: float, **caps: float) -> ServerSpec:
    """Llama-3.1-8B at bf16 (8.03e9 parameters x 2 bytes; 131,072 KV bytes a token)."""
    fields: dict[str, float] = {"max_num_seqs": 256, "gpu_memory_utilization": 0.9, **caps}
    return ServerSpec(
        gpu=gpu,
        memory_bandwidth_gb_s=bandwidth,
        compute_tflops=tflops,
        weight_bytes=16.06e9,
        parameters=8.03e9,
        kv_bytes_per_token=131072.0,
        num_layers=32,
        hidden_size=4096,
        **fields,  # type: ignore[arg-type]
    )


H100 = llama_on(
    "NVIDIA H100 SXM",
    3350.0,
    989.4,
    num_gpu_blocks=25000,
    max_num_batched_tokens=8192,
    max_model_len=32768,
)
H100_16_SEATS = llama_on(
    "NVIDIA H100 SXM",
    3350.0,
    989.4,
    num_gpu_blocks=25000,
    max_num_batched_tokens=8192,
    max_model_len=32768,
    max_num_seqs=16,
)
L40S = llama_on(
    "NVIDIA L40S",
    864.0,
    362.05,
    num_gpu_blocks=12000,
    max_num_batched_tokens=2048,
    max_model_len=32768,
)
CPU = llama_on(
    "CPU, dual-channel DDR5-5600",
    90.0,
    4.0,
    num_gpu_blocks=2048,
    max_num_batched_tokens=2048,
    max_model_len=8192,
)
A100_SMALL_POOL = llama_on(
    "NVIDIA A100 80GB SXM",
    2039.0,
    312.0,
    num_gpu_blocks=2048,
    max_num_batched_tokens=8192,
    max_model_len=8192,
    gpu_memory_utilization=0.27,
)

#: The tour's one server: the H100 with half its memory for vLLM (a 150,000-token pool).
H100_SHARED = llama_on(
    "NVIDIA H100 SXM",
    3350.0,
    989.4,
    num_gpu_blocks=9375,
    max_num_batched_tokens=8192,
    max_model_len=32768,
    gpu_memory_utilization=0.5,
)

HEALTHY = Workload(arrival_rate_per_s=3.0, prompt_tokens=600, output_tokens=180, spread=0.5)
PREFILL = Workload(arrival_rate_per_s=0.15, prompt_tokens=20000, output_tokens=24, seed=1)
DECODE = Workload(arrival_rate_per_s=0.04, prompt_tokens=48, output_tokens=400, seed=2)
QUEUE = Workload(arrival_rate_per_s=10.0, prompt_tokens=400, output_tokens=250, seed=3)
KV = Workload(arrival_rate_per_s=0.6, prompt_tokens=3000, output_tokens=1200, seed=4)
LATE_USERS = Workload(
    arrival_rate_per_s=0.1, prompt_tokens=600, output_tokens=180, spread=0.5, seed=5
)

TOUR_CHAT = Workload(arrival_rate_per_s=3.0, prompt_tokens=400, output_tokens=180, spread=0.5)
TOUR_DOCS = Workload(arrival_rate_per_s=1.3, prompt_tokens=10000, output_tokens=24, seed=1)
TOUR_LONG_ANSWERS = Workload(arrival_rate_per_s=7.3, prompt_tokens=64, output_tokens=1600, seed=2)


def tour_spike(rate: float, seed: int) -> Workload:
    return Workload(arrival_rate_per_s=rate, prompt_tokens=80, output_tokens=250, seed=seed)


def tour_kv(rate: float, seed: int) -> Workload:
    return Workload(arrival_rate_per_s=rate, prompt_tokens=300, output_tokens=1000, seed=seed)


EXPECTED: dict[str, Scenario] = {
    "healthy": Scenario("healthy", H100, (Phase(600.0, HEALTHY),), LLAMA),
    "prefill_bound": Scenario("prefill_bound", L40S, (Phase(600.0, PREFILL),), LLAMA),
    "decode_bound": Scenario("decode_bound", CPU, (Phase(600.0, DECODE),), LLAMA),
    "queue_bound": Scenario("queue_bound", H100_16_SEATS, (Phase(600.0, QUEUE),), LLAMA),
    "kv_pressure": Scenario("kv_pressure", A100_SMALL_POOL, (Phase(600.0, KV),), LLAMA),
    "stalled": Scenario(
        "stalled",
        H100,
        (
            Phase(240.0, HEALTHY),
            Phase(300.0, LATE_USERS, hang=True),
            Phase(120.0, HEALTHY),
        ),
        LLAMA,
    ),
    "tour": Scenario(
        "tour",
        H100_SHARED,
        (
            Phase(60.0, TOUR_CHAT, expect="healthy"),
            Phase(90.0, TOUR_DOCS, expect="prefill_bound"),
            Phase(105.0, TOUR_CHAT, expect="healthy"),
            Phase(90.0, TOUR_LONG_ANSWERS, expect="decode_bound"),
            Phase(105.0, TOUR_CHAT, expect="healthy"),
            Phase(10.0, tour_spike(100.0, 3), expect="queue_bound"),
            Phase(80.0, tour_spike(80.0, 5), expect="queue_bound"),
            Phase(105.0, TOUR_CHAT, expect="healthy"),
            Phase(12.0, tour_kv(25.0, 4), expect="kv_pressure"),
            Phase(78.0, tour_kv(12.0, 6), expect="kv_pressure"),
            Phase(105.0, TOUR_CHAT, expect="healthy"),
            Phase(60.0, TOUR_CHAT, hang=True, expect="stalled"),
            Phase(105.0, TOUR_CHAT, expect="healthy"),
        ),
        LLAMA,
        {"itl_p99_seconds": 0.024},
    ),
}

GOOD = """\
name: mine
server:
  gpu: a10g
  num_gpu_blocks: 4096
  max_num_batched_tokens: 2048
  max_model_len: 16384
phases:
  - duration_seconds: 30
    workload: {arrival_rate_per_s: 1, prompt_tokens: 300, output_tokens: 50}
  - duration_seconds: 30
    server: {max_num_seqs: 4}
    workload: {arrival_rate_per_s: 2, burst: 5, distribution: lognormal, seed: 7}
"""


class TestBundled:
    def test_the_seven_scenarios_are_listed(self) -> None:
        assert scenario_names() == tuple(sorted(EXPECTED))
        assert set(SCENARIOS) == set(EXPECTED) and len(SCENARIOS) == 7
        assert list_bundled("scenarios") == scenario_names()

    @pytest.mark.parametrize("name", sorted(EXPECTED))
    def test_each_file_is_the_old_preset(self, name: str) -> None:
        """Same server (every field), model, phases, workloads and seeds as the constants."""
        loaded, expected = get_scenario(name), EXPECTED[name]
        assert (loaded.name, loaded.model_name) == (expected.name, expected.model_name)
        assert loaded.spec == expected.spec
        # Labels only describe a phase (the live demo prints them); the rest must match.
        unlabelled = tuple(dataclasses.replace(p, label="") for p in loaded.phases)
        assert unlabelled == expected.phases
        assert dataclasses.replace(loaded, phases=unlabelled) == expected
        assert SCENARIOS[name] is loaded  # loaded once

    def test_llama_8b_builds_the_same_server(self) -> None:
        """The Python helper and the YAML defaults describe one model."""
        assert (
            llama_8b("h100", num_gpu_blocks=25000, max_num_batched_tokens=8192, max_model_len=32768)
            == H100
        )

    def test_read_bundled_reads_a_subfolder(self) -> None:
        data = read_bundled("scenarios/healthy.yaml")
        assert data["name"] == "healthy" and data["server"]["gpu"] == "NVIDIA H100 SXM"

    def test_every_file_says_why_in_its_header(self) -> None:
        for name in scenario_names():
            text = (BUNDLED_SCENARIOS / f"{name}.yaml").read_text()
            header = text.split("\nname:")[0]
            assert header.startswith(f"# {name}:") and "Why" in header

    def test_the_package_ships_the_folder(self) -> None:
        pyproject = (ROOT / "pyproject.toml").read_text()
        assert '"scenarios/*.yaml"' in pyproject

    def test_unknown_name_lists_the_known_ones(self) -> None:
        with pytest.raises(KeyError, match=r"kv_pressure.*tour"):
            get_scenario("nope")


class TestUserFiles:
    def test_a_user_file_loads_with_phase_overrides(self, tmp_path: Path) -> None:
        path = tmp_path / "mine.yaml"
        path.write_text(GOOD)
        sc = get_scenario(str(path))
        assert sc == load_scenario_file(path)
        assert (sc.name, sc.model_name, sc.duration_s) == ("mine", LLAMA, 60.0)
        assert sc.spec.gpu == "NVIDIA A10G" and sc.spec.max_num_seqs == 256
        first, second = sc.phases
        assert first.spec is None and first.workload.spread == 0.25  # Workload's default
        assert second.spec is not None
        assert second.spec.max_num_seqs == 4 and second.spec.num_gpu_blocks == 4096
        assert second.workload.distribution == "lognormal" and second.workload.burst == 5
        assert len(list(record(sc, start_at=0.0, interval_s=10.0))) == 7

    def test_a_card_not_in_the_table_is_given_by_its_figures(self, tmp_path: Path) -> None:
        path = tmp_path / "card.yaml"
        path.write_text(
            GOOD.replace("gpu: a10g", "gpu: My Card\n  memory_bandwidth_gb_s: 1000")
            .replace("num_gpu_blocks: 4096", "num_gpu_blocks: 4096\n  compute_tflops: 100")
            .replace("max_model_len: 16384", "max_model_len: 16384\n  dtype: fp8")
        )
        spec = load_scenario_file(path).spec
        assert (spec.gpu, spec.memory_bandwidth_gb_s, spec.compute_tflops) == ("My Card", 1000, 100)
        assert spec.weight_bytes == 8.03e9  # one byte a weight

    def test_experts_drafts_and_tensor_parallelism(self, tmp_path: Path) -> None:
        """A mixture of experts with speculative decoding over 2 GPUs: each GPU's share."""
        extra = (
            "  max_model_len: 16384\n  parameters_billion: 30\n  routed_experts_billion: 28\n"
            "  num_experts: 128\n  experts_per_token: 8\n  num_speculative_tokens: 3\n"
            "  draft_acceptance: 0.7\n  draft_parameters_billion: 0.5\n"
            "  tensor_parallel_size: 2\n  kv_heads: 4"
        )
        path = tmp_path / "moe.yaml"
        path.write_text(GOOD.replace("  max_model_len: 16384", extra))
        spec = load_scenario_file(path).spec
        assert spec.weight_bytes == pytest.approx(2e9 * 2 / 2)  # 2B shared, bf16, over 2
        assert spec.routed_expert_bytes == pytest.approx(28e9 * 2 / 2)
        assert spec.parameters == pytest.approx((2e9 + 28e9 * 8 / 128) / 2)
        assert (spec.num_experts, spec.experts_per_token) == (128, 8)
        assert (spec.num_speculative_tokens, spec.draft_acceptance) == (3, 0.7)
        assert spec.draft_weight_bytes == pytest.approx(0.5e9)
        assert spec.kv_bytes_per_token == 131072 / 2

    @pytest.mark.parametrize(
        ("edit", "message"),
        [
            (
                ("  max_model_len: 16384", "  max_model_len: 16384\n  colour: red"),
                r"server\.colour",
            ),
            (("arrival_rate_per_s: 1,", "arrival_rate_per_s: -1,"), r"phases\[0\]\.workload\."),
            (("{max_num_seqs: 4}", "{max_num_seq: 4}"), r"phases\[1\]\.server\.max_num_seq:"),
            (("gpu: a10g", "gpu: nonesuch"), r"server\.gpu: unknown GPU 'nonesuch'"),
            (("  num_gpu_blocks: 4096\n", ""), r"server\.num_gpu_blocks: required"),
            (("prompt_tokens: 300", "prompt_tokens: '300'"), r"phases\[0\]\.workload\.prompt_t"),
            (("max_num_seqs: 4}", "max_num_seqs: 4, dtype: int3}"), r"phases\[1\]\.server\.dtype"),
            (
                ("output_tokens: 50}", "output_tokens: 50, spread: 1}"),
                r"phases\[0\]\.workload: spr",
            ),
            (("num_gpu_blocks: 4096", "num_gpu_blocks: 10"), r"server: the KV pool must hold"),
            (("duration_seconds: 30", "duration_seconds: 0"), r"phases\[0\]\.duration_seconds"),
            (("name: mine\n", ""), r"mine\.yaml: name: Field required"),
            (
                (
                    "    workload: {arrival_rate_per_s: 1,",
                    "    hang: 'yes'\n    workload: {arrival_rate_per_s: 1,",
                ),
                r"phases\[0\]\.hang",
            ),
        ],
        ids=[
            "unknown-server-key",
            "negative-arrival-rate",
            "misspelt-phase-server-key",
            "unknown-gpu",
            "missing-num-gpu-blocks",
            "prompt-tokens-a-string",
            "unknown-dtype",
            "unknown-workload-key",
            "pool-too-small",
            "zero-duration",
            "missing-name",
            "hang-a-string",
        ],
    )
    def test_a_bad_file_names_the_file_and_key(
        self, tmp_path: Path, edit: tuple[str, str], message: str
    ) -> None:
        old, new = edit
        assert old in GOOD
        path = tmp_path / "mine.yaml"
        path.write_text(GOOD.replace(old, new, 1))
        with pytest.raises(ConfigError, match=message) as info:
            get_scenario(str(path))
        assert str(info.value).startswith(str(path))

    def test_not_yaml_and_missing_files_are_config_errors(self, tmp_path: Path) -> None:
        bad = tmp_path / "bad.yaml"
        bad.write_text("name: [unclosed\n")
        with pytest.raises(ConfigError, match="not valid YAML"):
            get_scenario(str(bad))
        with pytest.raises(ConfigError, match="cannot read"):
            get_scenario(str(tmp_path / "absent.yaml"))
        bad.write_text("- just\n- a list\n")
        with pytest.raises(ConfigError, match="top level"):
            get_scenario(str(bad))


class TestHoldLastPhase:
    def test_the_last_load_goes_on_and_the_start_is_unchanged(self) -> None:
        tour = get_scenario("tour")
        held = hold_last_phase(tour, 1125.0)
        assert held.duration_s == 1125.0 and held.phases[:-1] == tour.phases[:-1]
        assert held.phases[-1].workload == tour.phases[-1].workload
        assert hold_last_phase(tour, 100.0) is tour
        same = list(record(tour, start_at=0.0, interval_s=60.0, duration_s=1005.0))
        longer = list(record(held, start_at=0.0, interval_s=60.0, duration_s=1125.0))
        assert longer[: len(same)] == same
        # Past the old end, the healthy load keeps the counters moving.
        assert longer[-1][1] != longer[len(same) - 1][1]
