"""The hardware ceiling: GPU table, bytes per token from a model, and the decode ceiling."""

from __future__ import annotations

import json
from typing import Any

import pytest

from vllm_triage.ceiling.gpus import GPU, find_gpu, load_gpu_table, parse_gpu_table
from vllm_triage.ceiling.hardware import ceiling_rows, decode_ceiling_tokens_per_s
from vllm_triage.ceiling.sizing import (
    ModelSize,
    architecture_kv_bytes_per_token,
    bytes_per_param,
    model_size_from_config,
    model_size_from_parameters,
)
from vllm_triage.errors import ConfigError

from support.paths import CONFIGS


def config(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((CONFIGS / f"{name}.json").read_text(encoding="utf-8"))
    return data


# The seed article's table (docs/physics.md): 8B parameters at 16 bits on each device.
SEED_ROWS = [
    ("CPU, dual-channel DDR5-5600", 90, 6),
    ("NVIDIA A10G", 600, 38),
    ("NVIDIA L40S", 864, 54),
    ("NVIDIA RTX 4090", 1008, 63),
    ("NVIDIA A100 80GB SXM", 2039, 127),
    ("NVIDIA H100 SXM", 3350, 209),
]

# Every GPU the issue names, with its published bandwidth in GB/s.
REQUIRED_GPUS = [
    ("NVIDIA H100 PCIe", 2000),
    ("NVIDIA H200", 4800),
    ("NVIDIA B200", 8000),
    ("NVIDIA A100 40GB", 1555),
    ("NVIDIA L4", 300),
    ("NVIDIA T4", 320),
    ("NVIDIA RTX 3090", 936),
    ("AMD Instinct MI300X", 5300),
    ("NVIDIA A100 80GB PCIe", 1935),
    ("NVIDIA H100 NVL", 3900),
    ("NVIDIA L40", 864),
    ("NVIDIA A10", 600),
    ("NVIDIA RTX A6000", 768),
    ("NVIDIA RTX 6000 Ada", 960),
    ("NVIDIA V100 SXM2", 900),
    ("AMD Instinct MI325X", 6000),
    ("NVIDIA GH200", 4000),
    ("NVIDIA RTX 5090", 1792),
]

# A tiny Llama-style layout whose counts can be checked by hand:
#   attention per layer: q 8x8 + k 8x4 + v 8x4 + o 8x8 = 192
#   gated MLP per layer: 3 x 8 x 16 = 384;  norms: 2 per layer + final = 5 x 8 = 40
#   embeddings 10 x 8 = 80, lm_head 80 (untied)
#   parameters = 2 x (192 + 384) + 40 + 80 + 80 = 1352
TINY: dict[str, Any] = {
    "hidden_size": 8,
    "intermediate_size": 16,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "vocab_size": 10,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}


def by_name() -> dict[str, GPU]:
    return {g.name: g for g in load_gpu_table()}


class TestGPUTable:
    @pytest.mark.parametrize(
        ("name", "bandwidth", "ceiling"), SEED_ROWS, ids=[r[0] for r in SEED_ROWS]
    )
    def test_seed_rows_exact(self, name: str, bandwidth: float, ceiling: int) -> None:
        """The seed's six rows are present with the seed's bandwidth and cite the seed."""
        gpu = by_name()[name]
        assert gpu.memory_bandwidth_gb_s == bandwidth
        assert gpu.source.startswith("the reference table in docs/physics.md; ")

    def test_seed_rows_come_first_in_order(self) -> None:
        """The table opens with the seed's rows in the seed's order."""
        assert [g.name for g in load_gpu_table()[:6]] == [r[0] for r in SEED_ROWS]

    @pytest.mark.parametrize(
        ("name", "bandwidth"), REQUIRED_GPUS, ids=[r[0] for r in REQUIRED_GPUS]
    )
    def test_named_gpus_present(self, name: str, bandwidth: float) -> None:
        """Every GPU the issue names is in the table with its published bandwidth."""
        assert by_name()[name].memory_bandwidth_gb_s == bandwidth

    def test_every_entry_is_complete(self) -> None:
        """Each row has a positive bandwidth, a non-empty source, and positive TFLOPS if any."""
        for gpu in load_gpu_table():
            assert gpu.memory_bandwidth_gb_s > 0, gpu.name
            assert gpu.source.strip(), gpu.name
            assert gpu.bf16_dense_tflops is None or gpu.bf16_dense_tflops > 0, gpu.name

    def test_compute_figures_are_dense(self) -> None:
        """BF16 figures are dense (no sparsity): the H100 SXM lists 989, not 1979."""
        assert by_name()["NVIDIA H100 SXM"].bf16_dense_tflops == pytest.approx(989.4)

    def test_table_is_cached(self) -> None:
        """The bundled table is read once: repeated loads return the same object."""
        assert load_gpu_table() is load_gpu_table()

    @pytest.mark.parametrize(
        ("entry", "expected"),
        [
            ({"name": "X", "memory_bandwidth_gb_s": 0, "source": "s"}, "memory_bandwidth_gb_s"),
            ({"name": "X", "memory_bandwidth_gb_s": -5, "source": "s"}, "memory_bandwidth_gb_s"),
            ({"name": "X", "memory_bandwidth_gb_s": "600", "source": "s"}, "memory_bandwidth_gb_s"),
            ({"name": "X", "memory_bandwidth_gb_s": 600}, "source"),
            ({"name": "X", "memory_bandwidth_gb_s": 600, "source": "  "}, "source"),
            ({"name": "X", "memory_bandwidth_gb_s": 600, "source": "s", "tflops": 1}, "tflops"),
            ({"memory_bandwidth_gb_s": 600, "source": "s"}, "name"),
        ],
        ids=[
            "zero",
            "negative",
            "quoted-number",
            "no-source",
            "blank-source",
            "extra-key",
            "no-name",
        ],
    )
    def test_bad_entry_names_file_entry_and_key(self, entry: dict[str, Any], expected: str) -> None:
        """A bad row raises ConfigError naming rules/gpus.yaml, the row index and the key."""
        good = {"name": "Good", "memory_bandwidth_gb_s": 1, "source": "s"}
        with pytest.raises(ConfigError) as err:
            parse_gpu_table({"gpus": [good, entry]})
        message = str(err.value)
        assert message.startswith("rules/gpus.yaml: ")
        assert "gpus[1]" in message
        assert expected in message

    def test_bad_entry_message_quotes_its_name(self) -> None:
        """When the bad row has a name, the message quotes it so the user can find it."""
        with pytest.raises(ConfigError, match=r"gpus\[0\] \('Broken'\): memory_bandwidth_gb_s"):
            parse_gpu_table(
                {"gpus": [{"name": "Broken", "memory_bandwidth_gb_s": -1, "source": "s"}]}
            )

    @pytest.mark.parametrize("data", [None, [], {"gpus": []}, {"gpu": []}], ids=str)
    def test_bad_table_shape(self, data: Any) -> None:
        """A table that is empty or not a mapping with a ``gpus`` list is refused."""
        with pytest.raises(ConfigError, match=r"rules/gpus\.yaml"):
            parse_gpu_table(data)

    def test_alias_shared_by_two_gpus_is_refused(self) -> None:
        """An alias naming two GPUs would make lookups ambiguous, so loading fails."""
        rows = [
            {"name": "A", "aliases": ["fast"], "memory_bandwidth_gb_s": 1, "source": "s"},
            {"name": "B", "aliases": ["FAST"], "memory_bandwidth_gb_s": 2, "source": "s"},
        ]
        with pytest.raises(ConfigError, match="'fast' also names 'A'"):
            parse_gpu_table({"gpus": rows})


class TestFindGPU:
    @pytest.mark.parametrize(
        ("query", "name"),
        [
            ("h100", "NVIDIA H100 SXM"),
            ("H100-SXM5-80GB", "NVIDIA H100 SXM"),
            ("NVIDIA H100 80GB HBM3", "NVIDIA H100 SXM"),
            ("h100_pcie", "NVIDIA H100 PCIe"),
            ("a100-80gb", "NVIDIA A100 80GB SXM"),
            ("NVIDIA A100-SXM4-40GB", "NVIDIA A100 40GB"),
            ("A100 80GB SXM", "NVIDIA A100 80GB SXM"),
            ("4090", "NVIDIA RTX 4090"),
            ("NVIDIA GeForce RTX 4090", "NVIDIA RTX 4090"),
            ("nvidia l40s", "NVIDIA L40S"),
            ("L40", "NVIDIA L40"),
            ("Tesla T4", "NVIDIA T4"),
            ("MI300X", "AMD Instinct MI300X"),
            ("cpu", "CPU, dual-channel DDR5-5600"),
        ],
        ids=str,
    )
    def test_names_and_aliases(self, query: str, name: str) -> None:
        """Lookup ignores case, spaces, dashes and underscores, and matches aliases."""
        assert find_gpu(query).name == name

    @pytest.mark.parametrize(
        ("dcgm", "name"),
        [
            ("NVIDIA H100 80GB HBM3", "NVIDIA H100 SXM"),
            ("NVIDIA H100 PCIe", "NVIDIA H100 PCIe"),
            ("NVIDIA H100 NVL", "NVIDIA H100 NVL"),
            ("NVIDIA H200", "NVIDIA H200"),
            ("NVIDIA B200", "NVIDIA B200"),
            ("NVIDIA GH200 480GB", "NVIDIA GH200"),
            ("NVIDIA A100-SXM4-80GB", "NVIDIA A100 80GB SXM"),
            ("NVIDIA A100 80GB PCIe", "NVIDIA A100 80GB PCIe"),
            ("NVIDIA A100-SXM4-40GB", "NVIDIA A100 40GB"),
            ("NVIDIA A100-PCIE-40GB", "NVIDIA A100 40GB"),
            ("NVIDIA L40S", "NVIDIA L40S"),
            ("NVIDIA L40", "NVIDIA L40"),
            ("NVIDIA L4", "NVIDIA L4"),
            ("NVIDIA A10G", "NVIDIA A10G"),
            ("NVIDIA A10", "NVIDIA A10"),
            ("Tesla T4", "NVIDIA T4"),
            ("Tesla V100-SXM2-32GB", "NVIDIA V100 SXM2"),
            ("NVIDIA GeForce RTX 4090", "NVIDIA RTX 4090"),
            ("NVIDIA RTX A6000", "NVIDIA RTX A6000"),
            ("NVIDIA RTX 6000 Ada Generation", "NVIDIA RTX 6000 Ada"),
        ],
        ids=str,
    )
    def test_dcgm_model_names(self, dcgm: str, name: str) -> None:
        """The ``modelName`` label NVIDIA's DCGM exporter puts on every series (the name
        nvidia-smi prints) finds its row: fleet mode looks each server's card up by it."""
        assert find_gpu(dcgm).name == name

    def test_unknown_gpu_is_one_short_line_with_the_nearest_names(self) -> None:
        """An unknown name raises ConfigError: the nearest names, not the whole table."""
        with pytest.raises(ConfigError) as err:
            find_gpu("H100-80G")
        message = str(err.value)
        assert message.startswith("unknown GPU 'H100-80G'; did you mean NVIDIA H100 SXM, "), message
        assert "AMD Instinct MI300X" not in message and len(message) < 200
        assert "rules/gpus.yaml" in message

    def test_a_name_near_nothing_gets_no_guess(self) -> None:
        with pytest.raises(ConfigError) as err:
            find_gpu("Voodoo 3")
        assert "did you mean" not in str(err.value)
        assert str(err.value).startswith("unknown GPU 'Voodoo 3' (")


class TestBytesPerParam:
    @pytest.mark.parametrize(
        ("dtype", "size"),
        [
            ("fp32", 4),
            ("float32", 4),
            ("bf16", 2),
            ("bfloat16", 2),
            ("fp16", 2),
            ("float16", 2),
            ("half", 2),
            ("torch.bfloat16", 2),
            ("fp8", 1),
            ("float8", 1),
            ("int8", 1),
            ("int4", 0.5),
            ("4bit", 0.5),
            ("awq", 0.5),
            ("gptq-4bit", 0.5),
            ("FP16", 2),
        ],
        ids=str,
    )
    def test_table(self, dtype: str, size: float) -> None:
        """Each accepted dtype name maps to the bytes one weight occupies."""
        assert bytes_per_param(dtype) == size

    def test_unknown_lists_accepted(self) -> None:
        """An unknown dtype raises ConfigError listing the accepted names."""
        with pytest.raises(ConfigError, match=r"unknown dtype 'int3'; accepted: .*bfloat16.*int4"):
            bytes_per_param("int3")


class TestModelSizeFromParameters:
    def test_seed_arithmetic(self) -> None:
        """8B parameters at float16 read 16e9 bytes per token, with no KV layout known."""
        size = model_size_from_parameters(8, "float16")
        assert size == ModelSize(
            8e9, 16e9, None, "float16", active_parameters=8e9, dense_weight_bytes=16e9
        )

    def test_dtype_name_is_canonical(self) -> None:
        """Aliases are reported by their canonical name (``half`` is float16)."""
        assert model_size_from_parameters(1, "half").dtype == "float16"

    @pytest.mark.parametrize("value", [0, -1, float("nan"), float("inf")], ids=str)
    def test_non_positive_refused(self, value: float) -> None:
        """A parameter count must be a positive finite number."""
        with pytest.raises(ConfigError, match="parameters_billion"):
            model_size_from_parameters(value, "float16")


class TestDecodeCeiling:
    @pytest.mark.parametrize(
        ("name", "bandwidth", "ceiling"), SEED_ROWS, ids=[r[0] for r in SEED_ROWS]
    )
    def test_seed_table(self, name: str, bandwidth: float, ceiling: int) -> None:
        """8B at 16 bits reproduces the seed's ceiling on each of its six devices."""
        rate = decode_ceiling_tokens_per_s(find_gpu(name).memory_bandwidth_gb_s, 16e9)
        assert round(rate) == ceiling

    def test_int4_doubles_fp8(self) -> None:
        """Halving the bytes per weight (fp8 to int4) doubles the ceiling."""
        fp8 = model_size_from_parameters(70, "fp8").weight_bytes_per_token
        int4 = model_size_from_parameters(70, "int4").weight_bytes_per_token
        assert decode_ceiling_tokens_per_s(3350, int4) == pytest.approx(
            2 * decode_ceiling_tokens_per_s(3350, fp8)
        )

    def test_8bit_doubles_16bit(self) -> None:
        """The seed's remediation: quantizing 16-bit weights to 8 bits doubles the ceiling."""
        assert decode_ceiling_tokens_per_s(2039, 8e9) == pytest.approx(
            2 * decode_ceiling_tokens_per_s(2039, 16e9)
        )

    def test_tensor_parallel_doubles(self) -> None:
        """TP=2 reads half the weights on each GPU, so the ceiling doubles."""
        one = decode_ceiling_tokens_per_s(3350, 16e9)
        assert decode_ceiling_tokens_per_s(3350, 16e9, tensor_parallel_size=2) == pytest.approx(
            2 * one
        )

    def test_achievable_fraction_scales(self) -> None:
        """An achievable fraction of 0.5 halves the ceiling (published bandwidth is a peak)."""
        assert decode_ceiling_tokens_per_s(1000, 1e9, achievable_fraction=0.5) == pytest.approx(500)

    @pytest.mark.parametrize(
        ("args", "kwargs"),
        [
            ((0, 1e9), {}),
            ((1000, 0), {}),
            ((1000, 1e9), {"tensor_parallel_size": 0}),
            ((1000, 1e9), {"achievable_fraction": 0}),
            ((1000, 1e9), {"achievable_fraction": 1.5}),
        ],
        ids=["no-bandwidth", "no-bytes", "tp-0", "fraction-0", "fraction-above-1"],
    )
    def test_invalid_inputs(self, args: tuple[float, float], kwargs: dict[str, Any]) -> None:
        """Inputs outside their physical range raise ValueError instead of a wrong figure."""
        with pytest.raises(ValueError):
            decode_ceiling_tokens_per_s(*args, **kwargs)


class TestKVBytesPerToken:
    def test_seed_layout(self) -> None:
        """Llama 3.1 8B (32 layers, 8 KV heads, head_dim 128, 16-bit): 131,072 bytes."""
        assert architecture_kv_bytes_per_token(config("llama-3.1-8b"), 2) == 131072

    def test_explicit_head_dim_wins(self) -> None:
        """Qwen3-30B-A3B's head_dim 128 is used, not hidden/heads = 64: 2x48x4x128x2."""
        assert architecture_kv_bytes_per_token(config("qwen3-30b-a3b"), 2) == 98304

    def test_fp8_halves(self) -> None:
        """An 8-bit KV cache holds half the bytes per token."""
        assert architecture_kv_bytes_per_token(config("llama-3.1-8b"), 1) == 65536

    def test_kv_heads_default_to_attention_heads(self) -> None:
        """Without num_key_value_heads the model is plain multi-head attention."""
        cfg = {k: v for k, v in TINY.items() if k != "num_key_value_heads"}
        assert architecture_kv_bytes_per_token(cfg, 2) == 2 * 2 * 2 * 4 * 2

    def test_nested_text_config(self) -> None:
        """Multimodal configs are read from their text_config."""
        assert architecture_kv_bytes_per_token({"text_config": config("llama-3.1-8b")}, 2) == 131072

    def test_missing_key_named(self) -> None:
        """A missing layout key raises ConfigError naming it."""
        with pytest.raises(ConfigError, match="'num_hidden_layers'"):
            architecture_kv_bytes_per_token({"num_attention_heads": 8, "hidden_size": 64}, 2)


class TestModelSizeFromConfig:
    def test_llama_parameter_count(self) -> None:
        """Llama 3.1 8B counts 8.03e9 parameters (within 0.5%)."""
        assert model_size_from_config(config("llama-3.1-8b")).parameters == pytest.approx(
            8.03e9, rel=0.005
        )

    def test_llama_bytes_leave_out_input_embedding(self) -> None:
        """Per token a dense model reads every weight but the input table (one row of it)."""
        size = model_size_from_config(config("llama-3.1-8b"))
        table = 128256 * 4096
        assert size.weight_bytes_per_token == (size.parameters - table + 4096) * 2
        assert size.kv_bytes_per_token == 131072
        assert size.dtype == "bfloat16"
        assert any("input embedding table" in n for n in size.notes)

    def test_mixtral_total_and_active(self) -> None:
        """Mixtral 8x7B holds 46.7e9 parameters but reads about 12.9e9 per token."""
        size = model_size_from_config(config("mixtral-8x7b"))
        assert size.parameters == pytest.approx(46.7e9, rel=0.005)
        table = 32000 * 4096
        active = size.weight_bytes_per_token / 2 + table - 4096
        assert active == pytest.approx(12.9e9, rel=0.005)
        assert size.weight_bytes_per_token == pytest.approx((12.9e9 - table) * 2, rel=0.005)
        assert any("2 of 8 experts read per token" in n for n in size.notes)

    def test_qwen3_moe_total_and_active(self) -> None:
        """Qwen3-30B-A3B holds 30.5e9 parameters and reads about 3.3e9 (8 of 128 experts)."""
        size = model_size_from_config(config("qwen3-30b-a3b"))
        assert size.parameters == pytest.approx(30.5e9, rel=0.005)
        active = size.weight_bytes_per_token / 2 + 151936 * 2048
        assert active == pytest.approx(3.35e9, rel=0.01)
        assert size.kv_bytes_per_token == 98304

    def test_tiny_dense_by_hand(self) -> None:
        """The hand-counted layout: 1352 parameters, (1352 - 80 + 8) x 2 bytes, 32 KV bytes."""
        size = model_size_from_config(TINY)
        assert size.parameters == 1352
        assert size.weight_bytes_per_token == (1352 - 80 + 8) * 2
        assert size.kv_bytes_per_token == 2 * 2 * 1 * 4 * 2

    def test_tied_embeddings(self) -> None:
        """Tied embeddings count once and are read every token (by the lm_head)."""
        size = model_size_from_config({**TINY, "tie_word_embeddings": True})
        assert size.parameters == 1352 - 80
        assert size.weight_bytes_per_token == (1352 - 80) * 2
        assert any("tied embeddings" in n for n in size.notes)

    def test_untied_when_key_absent(self) -> None:
        """Without tie_word_embeddings the embeddings are assumed untied, and it says so."""
        size = model_size_from_config({k: v for k, v in TINY.items() if k != "tie_word_embeddings"})
        assert size.parameters == 1352
        assert any("tie_word_embeddings absent" in n for n in size.notes)

    def test_shared_expert_by_hand(self) -> None:
        """Qwen2-MoE style: shared expert and its gate read every token, 2 of 4 experts.

        expert 3x8x4 = 96, shared 3x8x8 = 192, router 8x4 + shared gate 8 = 40;
        per layer total 192 + 4x96 + 192 + 40 + 16 = 824, active 192 + 2x96 + 192 + 40 + 16 = 632.
        """
        cfg = {
            **TINY,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 4,
            "shared_expert_intermediate_size": 8,
        }
        size = model_size_from_config(cfg)
        assert size.parameters == 2 * 824 + 8 + 160
        assert size.weight_bytes_per_token == (2 * 632 + 8 + 80 + 8) * 2

    def test_first_dense_layers_and_shared_experts_by_hand(self) -> None:
        """DeepSeek style: the first k layers keep a dense MLP; n_shared_experts are read.

        layer 0 dense: 192 + 384 + 16 = 592; layer 1 sparse: 192 + 4x96 + 96 + 32 + 16 = 720,
        of which 192 + 2x96 + 96 + 32 + 16 = 528 are read.
        """
        cfg = {
            **TINY,
            "n_routed_experts": 4,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 4,
            "n_shared_experts": 1,
            "first_k_dense_replace": 1,
        }
        size = model_size_from_config(cfg)
        assert size.parameters == 592 + 720 + 8 + 160
        assert size.weight_bytes_per_token == (592 + 528 + 8 + 80 + 8) * 2

    def test_awq_quantizes_linear_layers_only(self) -> None:
        """4-bit AWQ: linear layers at 0.5 byte, embeddings/lm_head/norms stay 16-bit.

        linear 2 x (192 + 384) = 1152 at 0.5; norms 40 + lm_head 80 + one row 8 at 2.
        """
        cfg = {**TINY, "quantization_config": {"quant_method": "awq", "bits": 4}}
        size = model_size_from_config(cfg)
        assert size.dtype == "int4"
        assert size.weight_bytes_per_token == 1152 * 0.5 + (40 + 80 + 8) * 2
        assert size.parameters == 1352

    @pytest.mark.parametrize(
        ("qc", "dtype"),
        [
            ({"quant_method": "fp8"}, "fp8"),
            ({"quant_method": "gptq", "bits": 4}, "int4"),
            ({"quant_method": "gptq", "bits": 8}, "int8"),
            ({"quant_method": "bitsandbytes", "load_in_4bit": True}, "int4"),
            (
                {
                    "quant_method": "compressed-tensors",
                    "config_groups": {"g": {"weights": {"num_bits": 8, "type": "float"}}},
                },
                "fp8",
            ),
        ],
        ids=["fp8", "gptq-4", "gptq-8", "bnb-4", "compressed-fp8"],
    )
    def test_quantization_config_methods(self, qc: dict[str, Any], dtype: str) -> None:
        """Each quantization_config form is read as its weight width."""
        assert model_size_from_config({**TINY, "quantization_config": qc}).dtype == dtype

    def test_unknown_quantization_refused(self) -> None:
        """A quantization_config without a readable width asks for an explicit dtype."""
        cfg = {**TINY, "quantization_config": {"quant_method": "mystery"}}
        with pytest.raises(ConfigError, match=r"quantization_config.*--dtype"):
            model_size_from_config(cfg)

    def test_dtype_argument_overrides_quantization(self) -> None:
        """An explicit dtype replaces torch_dtype and quantization_config, with a note."""
        cfg = {**TINY, "quantization_config": {"quant_method": "fp8"}}
        size = model_size_from_config(cfg, dtype="float32")
        assert size.weight_bytes_per_token == (1352 - 80 + 8) * 4
        assert any("replaces the config's quantization_config" in n for n in size.notes)

    def test_weight_quantization_keeps_kv(self) -> None:
        """Quantizing weights leaves the KV cache 16-bit; kv_cache_dtype fp8 halves it."""
        quantized = model_size_from_config(config("llama-3.1-8b"), dtype="int4")
        assert quantized.kv_bytes_per_token == 131072
        assert any("does not shrink the KV cache" in n for n in quantized.notes)
        fp8_kv = model_size_from_config(config("llama-3.1-8b"), kv_cache_dtype="fp8")
        assert fp8_kv.kv_bytes_per_token == 65536
        auto = model_size_from_config(config("llama-3.1-8b"), kv_cache_dtype="auto")
        assert auto.kv_bytes_per_token == 131072

    def test_float32_checkpoint_counted_16bit(self) -> None:
        """vLLM serves float32 checkpoints in 16 bits by default, so 2 bytes are counted."""
        size = model_size_from_config({**TINY, "torch_dtype": "float32"})
        assert size.weight_bytes_per_token == (1352 - 80 + 8) * 2
        assert any("float32" in n for n in size.notes)

    def test_multimodal_text_config(self) -> None:
        """A multimodal config is sized from its text_config; dtype may sit at the top level."""
        text = {k: v for k, v in config("llama-3.1-8b").items() if k != "torch_dtype"}
        size = model_size_from_config({"text_config": text, "torch_dtype": "bfloat16"})
        assert size.parameters == model_size_from_config(config("llama-3.1-8b")).parameters
        assert size.dtype == "bfloat16"
        assert any("text_config" in n for n in size.notes)

    @pytest.mark.parametrize(
        "key",
        [
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "vocab_size",
            "intermediate_size",
        ],
    )
    def test_missing_required_key(self, key: str) -> None:
        """A missing required key raises ConfigError naming it."""
        cfg = {k: v for k, v in TINY.items() if k != key}
        with pytest.raises(ConfigError, match=f"missing required key '{key}'"):
            model_size_from_config(cfg)

    def test_missing_experts_per_token(self) -> None:
        """A mixture of experts without num_experts_per_tok cannot be sized."""
        cfg = {k: v for k, v in config("mixtral-8x7b").items() if k != "num_experts_per_tok"}
        with pytest.raises(ConfigError, match="'num_experts_per_tok'"):
            model_size_from_config(cfg)

    def test_missing_key_in_text_config_named_with_prefix(self) -> None:
        """Keys missing inside text_config are named with their path."""
        with pytest.raises(ConfigError, match=r"'text_config\.hidden_size'"):
            model_size_from_config({"text_config": {"num_hidden_layers": 2}})

    def test_latent_attention_needs_its_dims(self) -> None:
        """Multi-head latent attention without its rotary dim is refused, naming the key."""
        with pytest.raises(ConfigError, match="qk_rope_head_dim"):
            model_size_from_config({**TINY, "kv_lora_rank": 512})

    @pytest.mark.parametrize("value", ["4096", 0, -8, True, 8.0], ids=repr)
    def test_bad_layout_value_refused(self, value: Any) -> None:
        """A layout value that is not a positive integer is refused, naming the key."""
        with pytest.raises(ConfigError, match="'hidden_size' must be a positive integer"):
            model_size_from_config({**TINY, "hidden_size": value})

    def test_unknown_torch_dtype_named(self) -> None:
        """An unreadable torch_dtype is reported against that key."""
        with pytest.raises(ConfigError, match="torch_dtype: unknown dtype 'complex64'"):
            model_size_from_config({**TINY, "torch_dtype": "complex64"})


class TestCeilingRows:
    def test_keys_from_parameters(self) -> None:
        """Rows carry the ceiling and its inputs; no KV key when the layout is unknown."""
        [row] = ceiling_rows(model_size_from_parameters(8, "float16"), [find_gpu("h100")])
        assert row["gpu"] == "NVIDIA H100 SXM"
        assert row["memory_bandwidth_gb_s"] == 3350
        assert row["decode_ceiling_tokens_per_s"] == 209.38
        assert row["weight_bytes_per_token"] == 16e9
        assert row["parameters_billion"] == 8
        assert row["dtype"] == "float16"
        assert row["source"]
        assert "kv_bytes_per_token" not in row

    def test_kv_key_from_config(self) -> None:
        """Rows from a config.json carry its KV bytes per token."""
        size = model_size_from_config(config("llama-3.1-8b"))
        rows = ceiling_rows(size, load_gpu_table())
        assert len(rows) == len(load_gpu_table())
        assert {r["kv_bytes_per_token"] for r in rows} == {131072}

    def test_parallelism_and_fraction_applied(self) -> None:
        """TP and the achievable fraction change the ceiling and are reported in the row."""
        size = model_size_from_parameters(8, "float16")
        [row] = ceiling_rows(size, [find_gpu("h100")], 2, 0.5)
        assert row["decode_ceiling_tokens_per_s"] == 209.38
        assert (row["tensor_parallel_size"], row["achievable_fraction"]) == (2, 0.5)


class TestPublishedFigures:
    """The sizing against each model's published figures, and what the decode step
    roofline reads from it: active parameters, routed experts, KV bytes per token,
    tensor-parallel shares (``docs/physics.md``, "The decode roofline")."""

    def test_mixtral_8x7b(self) -> None:
        """46.7B parameters, 12.9B active (the published active count includes the
        input embedding table, which a token only looks a row up in)."""
        size = model_size_from_config(config("mixtral-8x7b"))
        table = 32000 * 4096
        assert size.parameters == pytest.approx(46.7e9, rel=0.005)
        assert size.active_parameters is not None
        assert size.active_parameters + table == pytest.approx(12.9e9, rel=0.01)
        assert (size.num_experts, size.experts_per_token) == (8, 2)
        assert size.kv_bytes_per_token == 2 * 32 * 8 * 128 * 2 == 131072
        assert size.kv_split == 8

    def test_deepseek_v3(self) -> None:
        """671B parameters (the multi-token-prediction module left out), 37B active;
        256 routed experts, 8 per token, 1 shared, the first 3 layers dense; FP8 weights;
        the MLA cache holds (512 + 64) x 61 layers x 2 bytes per token, whole on every GPU."""
        size = model_size_from_config(config("deepseek-v3"))
        assert size.parameters == pytest.approx(671e9, rel=0.005)
        assert size.active_parameters == pytest.approx(37e9, rel=0.02)
        assert (size.num_experts, size.experts_per_token) == (256, 8)
        expert = 3 * 7168 * 2048
        assert size.routed_expert_bytes == 58 * 256 * expert * 1  # fp8: one byte each
        assert size.dtype == "fp8"
        assert size.kv_bytes_per_token == (512 + 64) * 61 * 2 == 70272
        assert size.kv_split == 1
        assert any("latent attention" in n for n in size.notes)
        # scores over latent + rotary dims and values over the latent, 128 heads, 61 layers
        assert size.attention_flops_per_context_token == 61 * (2 * 128 * (512 + 64) + 2 * 128 * 512)

    def test_qwen3_30b_a3b(self) -> None:
        """30.5B parameters, 3.3B active (with the input table), 8 of 128 experts."""
        size = model_size_from_config(config("qwen3-30b-a3b"))
        assert size.parameters == pytest.approx(30.5e9, rel=0.005)
        assert size.active_parameters is not None
        assert size.active_parameters + 151936 * 2048 == pytest.approx(3.3e9, rel=0.02)
        assert (size.num_experts, size.experts_per_token) == (128, 8)
        assert size.kv_bytes_per_token == 2 * 48 * 4 * 128 * 2 == 98304
        assert size.kv_split == 4

    def test_moe_bytes_split_into_shared_and_routed(self) -> None:
        """Bytes read per token = every-step bytes + routed bytes x k / E."""
        for name in ("mixtral-8x7b", "qwen3-30b-a3b", "deepseek-v3"):
            s = model_size_from_config(config(name))
            assert s.dense_weight_bytes is not None
            per_token = s.dense_weight_bytes + s.routed_expert_bytes * (
                s.experts_per_token / s.num_experts
            )
            assert per_token == pytest.approx(s.weight_bytes_per_token), name

    def test_llama_3_1_70b_at_tp4(self) -> None:
        """About 35 GB of bf16 weights read per GPU at TP 4 (all but the input table,
        split four ways); 80 layers x 8 KV heads x 128 x 2 x 2 = 327,680 KV bytes per token."""
        size = model_size_from_config(config("llama-3.1-70b"))
        assert size.parameters == pytest.approx(70.6e9, rel=0.005)
        assert size.weight_bytes_per_token / 4 == pytest.approx(35e9, rel=0.01)
        assert size.kv_bytes_per_token == 327680
        assert size.kv_split == 8
        assert size.routed_expert_bytes == 0 and size.dense_weight_bytes == (
            size.weight_bytes_per_token
        )

    def test_dense_parameter_count_is_all_active(self) -> None:
        size = model_size_from_parameters(8.03, "bfloat16")
        assert size.active_parameters == pytest.approx(8.03e9)
        assert size.dense_weight_bytes == size.weight_bytes_per_token
