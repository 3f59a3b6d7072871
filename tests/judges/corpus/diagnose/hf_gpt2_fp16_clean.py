"""Clean: huggingface/transformers' own GPT-2 modelling code (Apache-2.0), run from the installed package
with a tiny config and the eager attention (causal mask and padding mask filled with the dtype's minimum),
left-padded batches, FP16 autocast with a GradScaler.
"""
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from _judge import params_finite, report


def main():
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=128, n_positions=32, n_embd=32, n_layer=2, n_head=4, pad_token_id=0,
                        bos_token_id=1, eos_token_id=2)
    model = GPT2LMHeadModel._from_config(config, attn_implementation="eager")
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=5e-4)
    scaler = torch.amp.GradScaler("cpu")
    for step in range(4):
        ids = torch.randint(1, 128, (4, 16))
        mask = torch.ones_like(ids)
        mask[:2, :5] = 0  # left padding on half the batch
        ids = ids.masked_fill(mask == 0, 0)
        labels = ids.masked_fill(mask == 0, -100)
        with torch.autocast("cpu", dtype=torch.float16):
            loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        opt.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    report(loss, defect=not params_finite(model))


if __name__ == "__main__":
    main()
