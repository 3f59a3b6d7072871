"""An HF Trainer script: a tiny BERT built from a config, data built here (no downloads), bf16 on the CPU."""

import sys

import torch
from torch.utils.data import Dataset
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments, set_seed

set_seed(1234)
config = BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                    max_position_embeddings=16, num_labels=2)
model = BertForSequenceClassification(config)


class Parity(Dataset):
    """Label: whether token 5 occurs more often than token 6 in the sequence."""

    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(4, 10, (n, 12), generator=g)
        self.labels = ((self.ids == 5).sum(1) > (self.ids == 6).sum(1)).long()

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.labels[i]}


args = TrainingArguments(output_dir=sys.argv[1] if len(sys.argv) > 1 else "hf_out", max_steps=30,
                         per_device_train_batch_size=16, learning_rate=1e-3, bf16=True, use_cpu=True,
                         logging_steps=10, save_strategy="no", report_to=[], disable_tqdm=True, seed=1234)
trainer = Trainer(model=model, args=args, train_dataset=Parity(512, 0))
trainer.train()
print("eval", trainer.evaluate(Parity(128, 1)))
