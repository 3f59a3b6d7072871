"""Clean: huggingface/transformers' own Llama modelling code (Apache-2.0), run from the installed package
with a tiny config: RMSNorm computed in FP32, rotary embeddings, grouped-query eager attention with the
causal and padding mask at the dtype's minimum, SwiGLU MLP, left-padded batches, FP16 autocast with a
GradScaler, unscale before clipping.
"""
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from _judge import params_finite, report


def main():
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         pad_token_id=0, bos_token_id=1, eos_token_id=2)
    model = LlamaForCausalLM._from_config(config, attn_implementation="eager")
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=5e-4, weight_decay=0.1, betas=(0.9, 0.95))
    scaler = torch.amp.GradScaler("cpu")
    for step in range(4):
        ids = torch.randint(3, 128, (4, 16))
        mask = torch.ones_like(ids)
        mask[2:, :6] = 0  # left padding
        ids = ids.masked_fill(mask == 0, 0)
        with torch.autocast("cpu", dtype=torch.float16):
            loss = model(input_ids=ids, attention_mask=mask, labels=ids.masked_fill(mask == 0, -100)).loss
        opt.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(opt)
        scaler.update()
    report(loss, defect=not params_finite(model))


if __name__ == "__main__":
    main()
