"""Shared helpers of the corpus scripts, as a real repository keeps them (datasets, metrics, seeding)."""
import random

import torch
from torch.utils.data import Dataset


def seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)


class SyntheticImages(Dataset):
    """Small random images with a learnable label (the mean of the red channel)."""

    def __init__(self, n: int = 128, size: int = 8, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, 3, size, size, generator=g)
        self.y = (self.x[:, 0].mean(dim=(1, 2)) > 0).long()

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


class SyntheticTokens(Dataset):
    """Token sequences whose next token is the previous one plus one (mod vocab)."""

    def __init__(self, n: int = 128, length: int = 32, vocab: int = 64, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        start = torch.randint(0, vocab, (n, 1), generator=g)
        self.seq = (start + torch.arange(length + 1)) % vocab

    def __len__(self) -> int:
        return len(self.seq)

    def __getitem__(self, i):
        return self.seq[i, :-1], self.seq[i, 1:]


def accuracy(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return (logits.argmax(-1) == target).float().mean()
