"""Writes small Qwen3.5 checkpoints with transformers' own classes and
save_pretrained, random weights (seeded), for hf_check.py: the layouts real
Qwen3.5 checkpoints have, which kvdrift's export does not write.

usage: hf_make_qwen35.py OUT_DIR

OUT_DIR/moe: Qwen3_5MoeForConditionalGeneration (model_type qwen3_5_moe): the
    language model under model.language_model., a vision tower beside it,
    fields in text_config, split Gated DeltaNet projections (in_proj_qkv,
    in_proj_z, in_proj_b, in_proj_a), sharded with an index.
OUT_DIR/moe-text: Qwen3_5MoeForCausalLM (model_type qwen3_5_moe_text): the
    same language model alone, under model.
OUT_DIR/dense: Qwen3_5ForConditionalGeneration (model_type qwen3_5): a dense
    SwiGLU feed-forward, tied input and output embeddings.
"""
import os
import sys

import torch
import transformers
from transformers import (Qwen3_5Config, Qwen3_5ForConditionalGeneration, Qwen3_5MoeConfig,
                          Qwen3_5MoeForCausalLM, Qwen3_5MoeForConditionalGeneration,
                          Qwen3_5MoeTextConfig)

TEXT = dict(hidden_size=128, num_hidden_layers=8, num_attention_heads=4, num_key_value_heads=2,
            head_dim=64, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=32,
            linear_value_head_dim=32, linear_conv_kernel_dim=4, vocab_size=512,
            max_position_embeddings=4096, rope_parameters={"rope_type": "default", "rope_theta": 1e7,
                                                           "partial_rotary_factor": 0.25})
MOE = dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=64, shared_expert_intermediate_size=64)
VISION = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=128)


def randomize(model, seed):
    """Weights drawn so that every path matters: N(0, 0.05), norms around
    zero (the (1 + w) RMSNorms) and the decay parameters in a sane range."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            x = torch.randn(p.shape, generator=g, dtype=torch.float32)
            if name.endswith("A_log"):
                x = torch.log(torch.empty(p.shape).uniform_(1, 16, generator=g))
            elif name.endswith("dt_bias"):
                x = 0.5 * x
            elif "norm" in name and p.ndim == 1:
                x = 0.1 * x if "linear_attn.norm" not in name else 1 + 0.1 * x
            else:
                x = 0.05 * x
            p.copy_(x.to(p.dtype))
    return model


def main():
    out = sys.argv[1]
    transformers.utils.logging.disable_progress_bar()
    torch.manual_seed(0)
    moe = Qwen3_5MoeForConditionalGeneration(Qwen3_5MoeConfig(text_config={**TEXT, **MOE}, vision_config=VISION))
    randomize(moe, 1).to(torch.bfloat16).save_pretrained(os.path.join(out, "moe"), max_shard_size="2MB")
    text = Qwen3_5MoeForCausalLM(Qwen3_5MoeTextConfig(**TEXT, **MOE))
    randomize(text, 2).to(torch.bfloat16).save_pretrained(os.path.join(out, "moe-text"))
    dense = Qwen3_5ForConditionalGeneration(Qwen3_5Config(text_config={**TEXT, "intermediate_size": 256,
                                                                       "tie_word_embeddings": True},
                                                          vision_config=VISION, tie_word_embeddings=True))
    randomize(dense, 3).to(torch.bfloat16).save_pretrained(os.path.join(out, "dense"))


if __name__ == "__main__":
    main()
