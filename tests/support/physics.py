"""The hardware and model facts the core's tests share, as the core is handed them
(``Roofline``, ``Ceiling``): Llama-3.1-8B at bf16 on one H100 SXM, and a 70B model on an
A10G. The figures are the bundled card table's and the model's published config
(``docs/physics.md``); a test that needs another fact replaces one field."""

from __future__ import annotations

from vllm_triage.core.rulebook import Ceiling, Roofline

#: An H100 SXM: memory bandwidth in bytes/s (3.35 TB/s) and dense bf16 compute in FLOP/s.
H100_BANDWIDTH = 3350e9
H100_BF16_FLOPS = 989.4e12
#: Llama-3.1-8B at bf16: 8.03e9 parameters of 2 bytes; one token's KV cache at 16 bits
#: (32 layers x 8 KV heads x 128 x K and V x 2 bytes).
LLAMA_8B_PARAMETERS = 8.03e9
LLAMA_8B_WEIGHT_BYTES = 16.06e9
LLAMA_8B_KV_BYTES_PER_TOKEN = 131072

#: The card alone: nothing known of the model.
H100_ALONE = Roofline(gpu="NVIDIA H100 SXM", memory_bandwidth_gb_s=3350, weight_bytes=None)
#: Llama-3.1-8B on one H100, every term of the step roofline known (its 8 KV heads split
#: the cache over up to 8 GPUs).
LLAMA_8B_ON_H100 = Roofline(
    gpu="NVIDIA H100 SXM",
    memory_bandwidth_gb_s=3350,
    weight_bytes=LLAMA_8B_WEIGHT_BYTES,
    compute_tflops=989.4,
    active_parameters=LLAMA_8B_PARAMETERS,
    kv_bytes_per_token=LLAMA_8B_KV_BYTES_PER_TOKEN,
    kv_split=8,
)
#: The same pair's single-stream decode ceiling: every weight read for each token,
#: 208.6 tokens a second.
LLAMA_8B_H100_CEILING = Ceiling(
    gpu="NVIDIA H100 SXM",
    memory_bandwidth_gb_s=3350,
    weight_bytes_per_token=LLAMA_8B_WEIGHT_BYTES,
    tokens_per_second=H100_BANDWIDTH / LLAMA_8B_WEIGHT_BYTES,
)
#: A 70B model at bf16 on an A10G (600 GB/s): 4.3 tokens a second for one stream.
A10G_70B = Ceiling(
    gpu="NVIDIA A10G",
    memory_bandwidth_gb_s=600,
    weight_bytes_per_token=140e9,
    tokens_per_second=600e9 / 140e9,
)
