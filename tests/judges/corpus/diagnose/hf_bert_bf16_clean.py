"""Clean: huggingface/transformers' own BERT modelling code (Apache-2.0), run from the installed package
with a tiny config: masked-language-model head, LayerNorm eps 1e-12 (BERT's), eager attention with an
additive padding mask of the dtype's minimum, right-padded batches, BF16 autocast, no scaler.
"""
import torch
from transformers import BertConfig, BertForMaskedLM

from _judge import params_finite, report


def main():
    torch.manual_seed(0)
    config = BertConfig(vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=64, max_position_embeddings=32, pad_token_id=0)
    model = BertForMaskedLM._from_config(config, attn_implementation="eager")
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=5e-4, weight_decay=0.01)
    for step in range(4):
        ids = torch.randint(5, 128, (4, 16))
        mask = torch.ones_like(ids)
        mask[1:, 10:] = 0  # right padding
        ids = ids.masked_fill(mask == 0, 0)
        labels = torch.full_like(ids, -100)
        chosen = (torch.rand(ids.shape) < 0.15) & (mask == 1)
        chosen[:, 1] = True
        labels[chosen] = ids[chosen]
        ids = ids.masked_fill(chosen, 4)  # [MASK]
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    report(loss, defect=not params_finite(model))


if __name__ == "__main__":
    main()
