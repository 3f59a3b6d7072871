"""``llama``: a Llama-style decoder that models the bytes of Python's own standard library.

The architecture of modern open LLMs (RMSNorm, rotary positions, grouped-query attention, a SwiGLU MLP, no
biases, an untied head) on the same text as ``charlm``, so ``ampkit compare`` can judge a precision at the
layer shapes of a 1-3B model (FP8 above all, whose plan decides by those shapes) on data that ships with
Python. Defaults are CPU-sized; ``d_model=3072, n_layers=20, n_heads=24, n_kv_heads=8, ffn=8192,
seq_len=2048`` is the 2.2B shape ``ampkit bench --model llama-1b`` times. The learning rate warms up
linearly over ``warmup`` steps and then decays on a cosine to a tenth, so a short run ends calm and its
final validation loss is a stable endpoint (a constant rate leaves it wherever the last steps threw it).

>>> import ampkit
>>> task = ampkit.load_task("llama", options={"d_model": 32, "n_heads": 4, "n_kv_heads": 2, "ffn": 64})
>>> x, y = task.batch(0)
>>> x.shape, bool((x[:, 1:] == y[:, :-1]).all())
(torch.Size([8, 128]), True)
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ampkit.errors import UsageError
from ampkit.tasks import Task
from ampkit.tasks.charlm import ByteData

__all__ = ["Block", "LlamaLM", "RMSNorm", "check_shape", "make_task"]


class RMSNorm(nn.Module):
    def __init__(self, d: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    a, b = x[..., ::2], x[..., 1::2]
    return torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(-2)


class Block(nn.Module):
    def __init__(self, d: int, n_heads: int, n_kv: int, ffn: int) -> None:
        super().__init__()
        self.n_heads, self.n_kv, self.hd = n_heads, n_kv, d // n_heads
        self.attn_norm = RMSNorm(d)
        self.q = nn.Linear(d, d, bias=False)
        self.k = nn.Linear(d, n_kv * self.hd, bias=False)
        self.v = nn.Linear(d, n_kv * self.hd, bias=False)
        self.o = nn.Linear(d, d, bias=False)
        self.mlp_norm = RMSNorm(d)
        self.gate = nn.Linear(d, ffn, bias=False)
        self.up = nn.Linear(d, ffn, bias=False)
        self.down = nn.Linear(ffn, d, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        h = self.attn_norm(x)
        q = self.q(h).view(b, t, self.n_heads, self.hd).transpose(1, 2)
        k = self.k(h).view(b, t, self.n_kv, self.hd).transpose(1, 2)
        v = self.v(h).view(b, t, self.n_kv, self.hd).transpose(1, 2)
        q, k = _rope(q, cos, sin), _rope(k, cos, sin)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.n_kv != self.n_heads)
        x = x + self.o(a.transpose(1, 2).reshape(b, t, -1))
        h = self.mlp_norm(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class LlamaLM(nn.Module):
    def __init__(self, *, vocab_size: int, d_model: int, n_layers: int, n_heads: int, n_kv_heads: int, ffn: int,
                 seq_len: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab_size, d_model)
        self.blocks = nn.ModuleList(Block(d_model, n_heads, n_kv_heads, ffn) for _ in range(n_layers))
        self.norm = RMSNorm(d_model)
        self.lm_head = nn.Linear(d_model, vocab_size, bias=False)
        hd = d_model // n_heads
        freqs = 1.0 / (10000.0 ** (torch.arange(0, hd, 2).float() / hd))
        angles = torch.outer(torch.arange(seq_len).float(), freqs)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)
        for block in self.blocks:  # the layers that write to the residual stream, scaled by depth (GPT-2's init)
            for proj in (block.o, block.down):
                nn.init.normal_(proj.weight, std=0.02 / math.sqrt(2 * n_layers))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        x = self.embed(idx)
        cos, sin = self.cos[:t], self.sin[:t]
        for block in self.blocks:
            x = block(x, cos, sin)
        return self.lm_head(self.norm(x))


def check_shape(d_model: int, n_heads: int, n_kv_heads: int) -> None:
    """Refuse a shape the attention cannot split (one line, for ``--task-arg`` and ``bench``)."""
    if min(d_model, n_heads, n_kv_heads) < 1 or d_model % n_heads or n_heads % n_kv_heads \
            or (d_model // n_heads) % 2:
        raise UsageError(f"llama: d_model={d_model} must divide into n_heads={n_heads} heads of even size, and "
                         f"n_heads into n_kv_heads={n_kv_heads} groups")


def _warmup_cosine(warmup: int, final: float):
    def make(optimizer: torch.optim.Optimizer, total_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
        def factor(step: int) -> float:
            if step < warmup:
                return (step + 1) / warmup
            t = min(1.0, (step - warmup) / max(1, total_steps - warmup))
            return final + (1 - final) * 0.5 * (1 + math.cos(math.pi * t))
        return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
    return make


def make_task(seed: int = 0, batch_size: int = 8, seq_len: int = 128, d_model: int = 64, n_layers: int = 2,
              n_heads: int = 4, n_kv_heads: int = 2, ffn: int = 172, vocab_size: int = 256,
              corpus_bytes: int = 1_000_000, eval_windows: int = 64, lr: float = 1e-3, warmup: int = 10,
              weight_decay: float = 0.1, device: torch.device | str | None = None) -> Task:
    """Build the task; weights come from the global RNG ``load_task`` seeds (so FP32 and AMP runs of a seed
    start from the same weights), batches from a generator per (seed, step). ``device`` (ampkit passes the
    run's): the model is built there, so a 2B model initializes on the accelerator in a moment instead of
    tens of seconds on the host."""
    check_shape(d_model, n_heads, n_kv_heads)
    if min(batch_size, seq_len, n_layers, ffn, eval_windows, warmup) < 1:
        raise UsageError("llama: batch_size, seq_len, n_layers, ffn, eval_windows and warmup must be positive")
    if vocab_size < 256:
        raise UsageError(f"llama: vocab_size={vocab_size} cannot hold the 256 byte values; use 256 or more")
    data = ByteData.split(seed, corpus_bytes, seq_len, batch_size, eval_windows, name="llama")
    with torch.device(device if device is not None else "cpu"):
        model = LlamaLM(vocab_size=vocab_size, d_model=d_model, n_layers=n_layers, n_heads=n_heads,
                        n_kv_heads=n_kv_heads, ffn=ffn, seq_len=seq_len)

    def loss(m: nn.Module, b: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        logits = m(b[0])
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), b[1].reshape(-1))

    n_params = sum(p.numel() for p in model.parameters())
    matmul = n_params - model.embed.weight.numel()  # the embedding is a lookup
    tokens = batch_size * seq_len
    size = f"{n_params / 1e9:.2f}B" if n_params >= 1e9 else f"{n_params / 1e6:.1f}M"
    return Task(
        name="llama", model=model, batch=data.batch, loss=loss, evaluate=data.evaluate, metric="loss",
        higher_is_better=False, samples_per_batch=batch_size, tokens_per_batch=tokens, lr=lr,
        weight_decay=weight_decay, default_steps=200,
        flops_per_step=float((6 * matmul + 6 * n_layers * d_model * seq_len) * tokens),
        make_scheduler=_warmup_cosine(warmup, 0.1),
        description=(f"Llama-style decoder ({size}: d={d_model}, {n_layers} layers, {n_heads}/{n_kv_heads} heads, "
                     f"SwiGLU {ffn}) on {len(data.data):,} bytes of Python's standard library, {batch_size} x "
                     f"{seq_len} bytes a step, lr {lr:g} (warmup {warmup}, cosine to a tenth); metric: "
                     f"validation loss (nats/byte) on {eval_windows} windows"),
        extra={"n_params": n_params, "corpus_bytes": len(data.data), "n_train_bytes": len(data.train),
               "n_val_bytes": len(data.val), "seq_len": seq_len, "vocab_size": vocab_size, "eval_windows": eval_windows},
    )
