"""Config-only checkpoints of targets teams serve, as their hub configs declare them (the fields that size them), and
the size of each published checkpoint's weight files, for checking what a plan makes of them."""

from __future__ import annotations

from pathlib import Path

GiB = 1024**3

# The published weight files' size in bytes (the hub's file listing, or the parameters times the dtype's bytes for
# a checkpoint whose every tensor is 16-bit).
PUBLISHED_BYTES = {
    "qwen3-30b-a3b": 61_064_216_576,  # 30.53B bf16 tensors
    "mixtral-8x7b": 93_405_585_408,  # 46.70B bf16 tensors
    "gpt-oss-20b": round(12.8 * GiB),  # its model card: MXFP4 experts, bf16 elsewhere
    "deepseek-v3": round(641.3 * GiB),  # 163 shards: fp8 weights with block scales, and its MTP layer
    "llama-3.1-70b-fp8": 72_700_000_000,  # 15 shards: fp8 linear layers, bf16 embeddings and lm_head
    "llama-3.1-70b": 141_107_412_992,  # 70.55B bf16 tensors
}
# Parameters as their model cards give them: (total, active a token).
PUBLISHED_PARAMETERS = {
    "qwen3-30b-a3b": (30.5e9, 3.3e9),
    "mixtral-8x7b": (46.7e9, 12.9e9),
    "gpt-oss-20b": (20.9e9, 3.6e9),  # OpenAI counts the active ones without the embedding table
    "deepseek-v3": (671e9, 37e9),  # besides its 14B of MTP module
    "llama-3.1-70b-fp8": (70.6e9, 70.6e9),
    "llama-3.1-70b": (70.6e9, 70.6e9),
}


def _configs() -> dict:
    import transformers as t

    fp8_blocks = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}
    fp8_channels = {
        "quant_method": "compressed-tensors",
        "format": "float-quantized",
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "weights": {"num_bits": 8, "type": "float", "strategy": "channel", "symmetric": True},
                "input_activations": {"num_bits": 8, "type": "float", "strategy": "token", "dynamic": True},
            }
        },
        "ignore": ["lm_head"],
    }
    mxfp4 = {
        "quant_method": "mxfp4",
        "modules_to_not_convert": [
            "model.layers.*.self_attn",
            "model.layers.*.mlp.router",
            "model.embed_tokens",
            "lm_head",
        ],
    }
    return {
        "qwen3-30b-a3b": t.Qwen3MoeConfig(
            vocab_size=151936, hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768,
            num_hidden_layers=48, num_attention_heads=32, num_key_value_heads=4, head_dim=128, num_experts=128,
            num_experts_per_tok=8, decoder_sparse_step=1, mlp_only_layers=[], max_position_embeddings=40960,
            tie_word_embeddings=False, architectures=["Qwen3MoeForCausalLM"],
        ),
        "mixtral-8x7b": t.MixtralConfig(
            vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
            num_attention_heads=32, num_key_value_heads=8, num_local_experts=8, num_experts_per_tok=2,
            max_position_embeddings=32768, architectures=["MixtralForCausalLM"],
        ),
        "gpt-oss-20b": t.GptOssConfig(
            vocab_size=201088, hidden_size=2880, intermediate_size=2880, num_hidden_layers=24,
            num_attention_heads=64, num_key_value_heads=8, head_dim=64, num_local_experts=32, num_experts_per_tok=4,
            max_position_embeddings=131072, quantization_config=mxfp4, architectures=["GptOssForCausalLM"],
        ),
        "deepseek-v3": t.DeepseekV3Config(
            vocab_size=129280, hidden_size=7168, intermediate_size=18432, moe_intermediate_size=2048,
            num_hidden_layers=61, num_attention_heads=128, num_key_value_heads=128, n_shared_experts=1,
            n_routed_experts=256, num_experts_per_tok=8, first_k_dense_replace=3, kv_lora_rank=512,
            q_lora_rank=1536, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, n_group=8, topk_group=4,
            max_position_embeddings=163840, num_nextn_predict_layers=1, quantization_config=fp8_blocks,
            architectures=["DeepseekV3ForCausalLM"],
        ),
        "llama-3.1-70b-fp8": t.LlamaConfig(
            vocab_size=128256, hidden_size=8192, intermediate_size=28672, num_hidden_layers=80,
            num_attention_heads=64, num_key_value_heads=8, max_position_embeddings=131072, rope_theta=500000.0,
            tie_word_embeddings=False, quantization_config=fp8_channels, architectures=["LlamaForCausalLM"],
        ),
        "llama-3.1-70b": t.LlamaConfig(
            vocab_size=128256, hidden_size=8192, intermediate_size=28672, num_hidden_layers=80,
            num_attention_heads=64, num_key_value_heads=8, max_position_embeddings=131072, rope_theta=500000.0,
            tie_word_embeddings=False, architectures=["LlamaForCausalLM"],
        ),
    }  # fmt: skip


def save_published_configs(root: Path) -> Path:
    """Each one's config.json (bf16, as published) in its own directory under `root`."""
    for name, config in _configs().items():
        config.dtype = "bfloat16"
        config.save_pretrained(root / name)
    return root


def _mtp_configs() -> dict:
    """Targets that ship their own MTP layer, beside DeepSeek-V3 above: Qwen 3.5, dense and mixture of experts, as
    multimodal configs with the language model's fields (and `mtp_num_hidden_layers`) in text_config. Their values
    are those of published copies of the 27B and 35B-A3B configs (the hub itself was out of reach)."""
    import transformers as t

    linear = dict(
        linear_key_head_dim=128, linear_value_head_dim=128, linear_conv_kernel_dim=4, full_attention_interval=4,
        rms_norm_eps=1e-6, max_position_embeddings=262144, tie_word_embeddings=False, mtp_num_hidden_layers=1,
    )  # fmt: skip
    return {
        "qwen3.5-27b": t.Qwen3_5Config(
            text_config=dict(
                vocab_size=248320, hidden_size=5120, intermediate_size=17408, num_hidden_layers=64,
                num_attention_heads=24, num_key_value_heads=4, head_dim=256, linear_num_key_heads=16,
                linear_num_value_heads=48, **linear,
            ),
            architectures=["Qwen3_5ForConditionalGeneration"],
        ),
        "qwen3.5-35b-a3b": t.Qwen3_5MoeConfig(
            text_config=dict(
                vocab_size=248320, hidden_size=2048, num_hidden_layers=40, num_attention_heads=16,
                num_key_value_heads=2, head_dim=256, linear_num_key_heads=16, linear_num_value_heads=32,
                num_experts=256, num_experts_per_tok=8, moe_intermediate_size=512,
                shared_expert_intermediate_size=512, **linear,
            ),
            architectures=["Qwen3_5MoeForConditionalGeneration"],
        ),
    }  # fmt: skip


def save_mtp_configs(root: Path) -> Path:
    """The MTP targets' config.json files (bf16), DeepSeek-V3's among them, each in its own directory under `root`."""
    configs = {"deepseek-v3": _configs()["deepseek-v3"], **_mtp_configs()}
    for name, config in configs.items():
        config.dtype = "bfloat16"
        config.save_pretrained(root / name)
    return root
