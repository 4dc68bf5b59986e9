"""The card table (rules/gpus.yaml): the rows the model and pool work needs, their
optional FP8 and memory columns, and the compute ridge each card implies."""

from __future__ import annotations

import pytest

from vllm_triage.ceiling.gpus import GPU, find_gpu, load_gpu_table, parse_gpu_table
from vllm_triage.errors import ConfigError

#: Card -> (bandwidth GB/s, dense BF16 TFLOPS, dense FP8 TFLOPS or None, memory GB).
CARDS: dict[str, tuple[float, float, float | None, float]] = {
    "NVIDIA H100 SXM": (3350, 989.4, 1978.9, 80),
    "NVIDIA H100 PCIe": (2000, 756, 1513, 80),
    "NVIDIA H100 NVL": (3900, 835.5, 1670.5, 94),
    "NVIDIA H200": (4800, 989.5, 1979, 141),
    "NVIDIA H20": (4000, 148, 296, 96),
    "NVIDIA B200": (8000, 2250, 4500, 180),
    "NVIDIA B300": (8000, 2250, 4500, 288),
    "NVIDIA GB200": (8000, 2500, 5000, 186),
    "NVIDIA GB300": (8000, 2500, 5000, 288),
    "AMD Instinct MI300X": (5300, 1307.4, 2614.9, 192),
    "AMD Instinct MI325X": (6000, 1307.4, 2614.9, 256),
    "AMD Instinct MI350X": (8000, 2306.9, 4613.7, 288),
    "AMD Instinct MI355X": (8000, 2516.6, 5033.2, 288),
    "Intel Gaudi 3": (3700, 1835, 1835, 128),
    "Google TPU v5e": (819, 197, None, 16),
    "Google TPU v6e": (1638, 918, None, 32),
    "NVIDIA L40S": (864, 362.05, 733, 48),
    "NVIDIA L4": (300, 121, 242.5, 24),
    "NVIDIA RTX 4090": (1008, 165.2, 330.3, 24),
    "NVIDIA RTX 5090": (1792, 209.5, 419, 32),
}


def by_name() -> dict[str, GPU]:
    return {g.name: g for g in load_gpu_table()}


@pytest.mark.parametrize("name", sorted(CARDS))
def test_card_row_has_its_published_figures(name: str) -> None:
    bandwidth, bf16, fp8, memory = CARDS[name]
    gpu = by_name()[name]
    assert gpu.memory_bandwidth_gb_s == bandwidth
    assert gpu.bf16_dense_tflops == pytest.approx(bf16)
    assert gpu.fp8_dense_tflops == (None if fp8 is None else pytest.approx(fp8))
    assert gpu.memory_gb == memory


def test_every_row_cites_a_source_and_derived_rows_say_so() -> None:
    """A figure derived from rack or board totals, or from no vendor datasheet, says so."""
    rows = by_name()
    for gpu in rows.values():
        assert gpu.source.strip(), gpu.name
    for name in ("NVIDIA GB200", "NVIDIA GB300", "NVIDIA B300", "AMD Instinct MI355X"):
        assert "derived" in rows[name].note.lower(), name
    assert "not from a vendor datasheet" in rows["NVIDIA H20"].note.lower()


def test_fp8_is_at_least_bf16_wherever_both_exist() -> None:
    both = [g for g in load_gpu_table() if g.fp8_dense_tflops and g.bf16_dense_tflops]
    assert len(both) >= 20
    for gpu in both:
        assert gpu.fp8_dense_tflops is not None and gpu.bf16_dense_tflops is not None
        assert gpu.fp8_dense_tflops >= gpu.bf16_dense_tflops, gpu.name
        # Dense, not sparse: FP8 is at most twice the BF16 rate on these parts (a sparse
        # figure would be four times). The L40S datasheet's own rounding gives 2.02.
        assert gpu.fp8_dense_tflops <= 2.05 * gpu.bf16_dense_tflops, gpu.name


def test_memory_is_given_for_every_card_but_the_shared_and_cpu_rows() -> None:
    missing = {g.name for g in load_gpu_table() if g.memory_gb is None}
    assert missing == {"CPU, dual-channel DDR5-5600", "NVIDIA V100 SXM2"}


def ridge_tokens(gpu: GPU, bytes_per_param: float = 2.0) -> float:
    """Tokens per step above which a step's compute outlasts its weight reads:
    peak FLOP/s x bytes per parameter / (2 FLOPs per parameter x bandwidth)."""
    assert gpu.bf16_dense_tflops is not None
    return gpu.bf16_dense_tflops * 1e12 * bytes_per_param / (2 * gpu.memory_bandwidth_gb_s * 1e9)


@pytest.mark.parametrize(
    ("name", "ridge"),
    [("NVIDIA H100 SXM", 295), ("NVIDIA H20", 37), ("NVIDIA H200", 206), ("NVIDIA B200", 281)],
)
def test_compute_ridge(name: str, ridge: float) -> None:
    assert ridge_tokens(find_gpu(name)) == pytest.approx(ridge, abs=1)


def test_fp8_ridge_doubles_the_flops_and_halves_the_bytes() -> None:
    """At FP8 a weight is one byte and the peak doubles: the ridge stays where it was."""
    h100 = find_gpu("h100")
    assert h100.fp8_dense_tflops is not None
    fp8 = h100.fp8_dense_tflops * 1e12 * 1.0 / (2 * h100.memory_bandwidth_gb_s * 1e9)
    assert fp8 == pytest.approx(ridge_tokens(h100), rel=0.01)


@pytest.mark.parametrize(
    ("dcgm", "name"),
    [
        ("NVIDIA H200", "NVIDIA H200"),
        ("NVIDIA H20", "NVIDIA H20"),
        ("NVIDIA B200", "NVIDIA B200"),
        ("NVIDIA B300 SXM6 AC", "NVIDIA B300"),
        ("NVIDIA GB200", "NVIDIA GB200"),
        ("NVIDIA GB300", "NVIDIA GB300"),
        ("NVIDIA H100 NVL", "NVIDIA H100 NVL"),
        ("NVIDIA H100 PCIe", "NVIDIA H100 PCIe"),
        ("AMD Instinct MI355X", "AMD Instinct MI355X"),
        ("gaudi3", "Intel Gaudi 3"),
        ("trillium", "Google TPU v6e"),
    ],
)
def test_dcgm_and_common_names_find_the_row(dcgm: str, name: str) -> None:
    assert find_gpu(dcgm).name == name


def test_h20_is_not_h200() -> None:
    """One digit apart, a sixth of the compute: the lookup must not confuse them."""
    assert find_gpu("h20").name == "NVIDIA H20"
    assert find_gpu("h200").name == "NVIDIA H200"
    with pytest.raises(ConfigError):
        find_gpu("NVIDIA H20-3e")


@pytest.mark.parametrize(
    "extra",
    [{"memory_gb": 0}, {"memory_gb": "80"}, {"fp8_dense_tflops": -1}, {"fp8_tflops": 1}],
    ids=["zero-memory", "quoted-memory", "negative-fp8", "typo"],
)
def test_new_columns_are_strict(extra: dict[str, object]) -> None:
    row = {"name": "X", "memory_bandwidth_gb_s": 100, "source": "s", **extra}
    with pytest.raises(ConfigError, match=r"gpus\[0\] \('X'\)"):
        parse_gpu_table({"gpus": [row]})


def test_new_columns_are_optional() -> None:
    [gpu] = parse_gpu_table({"gpus": [{"name": "X", "memory_bandwidth_gb_s": 100, "source": "s"}]})
    assert gpu.fp8_dense_tflops is None and gpu.memory_gb is None
