"""``charlm``: a small causal transformer that models the bytes of Python's own standard library.

The text is the source of the standard library's top-level ``*.py`` files, read from disk, so the
task needs no download and no extra package. Defaults train in seconds on a CPU; the options scale it
to a GPU benchmark (``d_model=768, n_layers=12, n_heads=12, seq_len=1024, vocab_size=50304`` is the
GPT-2-small shape):

>>> import ampkit
>>> task = ampkit.load_task("charlm", options={"d_model": 32})
>>> x, y = task.batch(0)
>>> x.shape, bool((x[:, 1:] == y[:, :-1]).all())
(torch.Size([16, 64]), True)
"""

from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ampkit.errors import UsageError
from ampkit.tasks import Task

__all__ = ["Block", "ByteData", "CharLM", "load_corpus", "make_task", "windows"]

VAL_FRACTION = 0.1
EVAL_WINDOWS = 16
EVAL_SEED = 1234  # the validation windows are the same for every task seed


@functools.lru_cache(maxsize=4)
def _read_corpus(corpus_bytes: int) -> bytes:
    stdlib = os.path.dirname(os.__file__)
    parts, total = [], 0
    for name in sorted(os.listdir(stdlib)):  # sorted: the same bytes on every run of this Python
        path = os.path.join(stdlib, name)
        if not name.endswith(".py") or not os.path.isfile(path):
            continue
        try:
            with open(path, "rb") as fh:
                data = fh.read()
        except OSError:
            continue  # unreadable files are skipped, the rest still make a corpus
        parts.append(data)
        total += len(data)
        if total >= corpus_bytes:
            break
    return b"".join(parts)[:corpus_bytes]


def load_corpus(corpus_bytes: int = 400_000) -> torch.Tensor:
    """The first ``corpus_bytes`` of the standard library's source as a 1-D ``uint8`` tensor."""
    data = _read_corpus(corpus_bytes)
    # bytearray: torch.frombuffer wants a writable buffer, and a copy keeps the cache immutable.
    return torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8)


class Block(nn.Module):
    """Pre-LayerNorm transformer block: causal self-attention, then a 4x GELU MLP, both residual."""

    def __init__(self, d_model: int, n_heads: int):
        super().__init__()
        self.n_heads = n_heads
        self.ln1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.ln2 = nn.LayerNorm(d_model)
        self.fc = nn.Linear(d_model, 4 * d_model)
        self.fc_proj = nn.Linear(4 * d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.n_heads, d // self.n_heads).transpose(1, 2) for z in (q, k, v))
        # The fused kernel (flash / memory-efficient where the backend has one) and its causal mask.
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, d))
        return x + self.fc_proj(F.gelu(self.fc(self.ln2(x))))


class CharLM(nn.Module):
    """Token + learned position embeddings, ``blocks`` (an ``nn.ModuleList``), final LayerNorm, head.

    The head shares its weight with the token embedding (as GPT-2 does). Distributed code shards
    per block through ``model.blocks``.
    """

    def __init__(self, *, vocab_size: int = 256, d_model: int = 64, n_layers: int = 2, n_heads: int = 4,
                 max_len: int = 64):
        super().__init__()
        self.max_len = max_len
        self.tok = nn.Embedding(vocab_size, d_model)
        self.pos = nn.Embedding(max_len, d_model)
        self.blocks = nn.ModuleList([Block(d_model, n_heads) for _ in range(n_layers)])
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab_size, bias=False)
        self.head.weight = self.tok.weight
        self._init_weights(n_layers)

    def _init_weights(self, n_layers: int) -> None:
        # GPT-2's scheme: small normal weights, and residual projections shrunk by depth so the
        # residual stream's variance does not grow with the number of blocks.
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
        for block in self.blocks:
            for proj in (block.proj, block.fc_proj):
                nn.init.normal_(proj.weight, std=0.02 / math.sqrt(2 * n_layers))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """``idx``: ``(batch, time)`` int64 bytes -> logits ``(batch, time, vocab_size)``."""
        t = idx.shape[1]
        if t > self.max_len:
            raise ValueError(f"sequence of {t} tokens is longer than the model's max_len={self.max_len}")
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def windows(data: torch.Tensor, starts: torch.Tensor, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    idx = starts[:, None] + torch.arange(seq_len + 1)
    chunk = data[idx].long()
    return chunk[:, :-1], chunk[:, 1:]


@dataclass(frozen=True)
class ByteData:
    """A byte corpus split for a language model (the last tenth validates) and the two ways the tasks read it:
    ``batch(step)``, pure in (seed, step) so resume and FP32-vs-AMP runs agree, and ``evaluate``, the loss
    over fixed validation windows (the same for every seed)."""

    data: torch.Tensor
    train: torch.Tensor
    val: torch.Tensor
    x_val: torch.Tensor
    y_val: torch.Tensor
    seed: int
    seq_len: int
    batch_size: int

    @classmethod
    def split(cls, seed: int, corpus_bytes: int, seq_len: int, batch_size: int, eval_windows: int, *,
              name: str) -> ByteData:
        data = load_corpus(corpus_bytes)
        n_val = int(len(data) * VAL_FRACTION)
        train, val = data[: len(data) - n_val], data[len(data) - n_val:]
        if len(val) <= seq_len + 1:
            raise UsageError(f"{name}: a corpus of {len(data)} bytes leaves {len(val)} validation bytes, too few "
                             f"for seq_len={seq_len}; raise corpus_bytes to at least {20 * (seq_len + 2)}")
        starts = torch.randint(0, len(val) - seq_len, (eval_windows,),
                               generator=torch.Generator().manual_seed(EVAL_SEED))
        x_val, y_val = windows(val, starts, seq_len)
        return cls(data, train, val, x_val, y_val, seed, seq_len, batch_size)

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
        starts = torch.randint(0, len(self.train) - self.seq_len, (self.batch_size,), generator=g)
        return windows(self.train, starts, self.seq_len)

    def evaluate(self, model: nn.Module, device: torch.device) -> dict[str, float]:
        total = torch.zeros((), device=device)
        for i in range(0, len(self.x_val), self.batch_size):  # chunks of batch_size bound the memory
            x, y = self.x_val[i:i + self.batch_size].to(device), self.y_val[i:i + self.batch_size].to(device)
            logits = model(x)
            total += F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), y.reshape(-1), reduction="sum")
        val_loss = (total / self.y_val.numel()).item()
        return {"loss": val_loss, "bits_per_byte": val_loss / math.log(2)}


def make_task(seed: int = 0, batch_size: int = 16, seq_len: int = 64, d_model: int = 64, n_layers: int = 2,
              n_heads: int = 4, vocab: str = "bytes", corpus_bytes: int = 400_000,
              vocab_size: int = 256) -> Task:
    """Build the byte-level language-model task; weights come from the global RNG ``load_task`` seeds.

    ``vocab_size`` above 256 only widens the embedding and head (the data are still bytes), so a
    benchmark can match the shape of a model with a real tokenizer.
    """
    if vocab != "bytes":
        raise ValueError(f"vocab={vocab!r} is not supported: the only vocabulary is 'bytes'")
    if vocab_size < 256:
        raise ValueError(f"vocab_size={vocab_size} cannot hold the 256 byte values; use 256 or more")
    if min(batch_size, seq_len, d_model, n_layers, n_heads) < 1:
        raise ValueError("batch_size, seq_len, d_model, n_layers and n_heads must be positive")
    if d_model % n_heads:
        raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}")
    data = ByteData.split(seed, corpus_bytes, seq_len, batch_size, EVAL_WINDOWS, name="charlm")
    model = CharLM(vocab_size=vocab_size, d_model=d_model, n_layers=n_layers, n_heads=n_heads, max_len=seq_len)

    def loss(model: nn.Module, b: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        logits = model(b[0])
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), b[1].reshape(-1))

    tokens = batch_size * seq_len
    # Position embeddings are a lookup, not a matmul; the tied head counts once, as the head matmul.
    n_params = sum(p.numel() for p in model.parameters()) - model.pos.weight.numel()
    flops = 6 * n_params * tokens + 12 * n_layers * d_model * seq_len * tokens
    return Task(
        name="charlm",
        model=model,
        batch=data.batch,
        loss=loss,
        evaluate=data.evaluate,
        metric="loss",
        higher_is_better=False,
        samples_per_batch=batch_size,
        tokens_per_batch=tokens,
        lr=3e-3,
        weight_decay=0.1,
        default_steps=200,
        flops_per_step=float(flops),
        description=(f"byte-level causal transformer (d_model={d_model}, {n_layers} layers, {n_heads} heads, "
                     f"seq_len={seq_len}) on {len(data.data):,} bytes of Python's standard library; "
                     f"metric: validation loss (nats/byte)"),
        extra={"n_params": n_params, "corpus_bytes": len(data.data), "n_train_bytes": len(data.train),
               "n_val_bytes": len(data.val), "seq_len": seq_len, "vocab_size": vocab_size},
    )
