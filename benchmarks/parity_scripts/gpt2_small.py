"""GPT-2-small (Hugging Face, random weights, SDPA attention) for two BF16 autocast steps on CUDA: `ampkit parity` input."""
import torch
from transformers import GPT2Config, GPT2LMHeadModel

torch.manual_seed(0)
cfg = GPT2Config(n_layer=12, n_embd=768, n_head=12, vocab_size=50257, n_positions=1024,
                 attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0)
model = GPT2LMHeadModel(cfg).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
for step in range(2):
    idx = torch.randint(0, 50257, (2, 128), device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(idx, labels=idx).loss
    loss.backward()
    opt.step()
    opt.zero_grad()
