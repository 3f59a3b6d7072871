"""``ampkit bench --model llama-1b``: a Llama-style decoder in the TinyLlama-1.1B shape, for FP8 at scale.

d_model 2048, 22 layers, 32 query heads and 4 key/value heads (grouped-query attention), SwiGLU MLP of 5632,
RMSNorm, rotary positions, no biases, an untied head over a 32000-token vocabulary: 1.10B parameters. 8
sequences of 2048 random tokens a step (16384 tokens: what each linear layer's GEMM sees as M), AdamW. It
trains on one H200 in BF16 and in FP8 with AdamW, eager or compiled (about 60 GB peak in eager BF16).
Every option can be changed with ``--task-arg`` (``d_model``, ``n_layers``, ``n_heads``, ``n_kv_heads``,
``ffn``, ``vocab_size``, ``seq_len``, ``batch_size``, ``lr``), so the CPU tests build the same code tiny.
Random tokens: this workload measures speed, and a step's cost does not depend on the token values.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ampkit.errors import UsageError

__all__ = ["LLAMA_1B", "LlamaLM", "build_llama"]

LLAMA_1B = {"d_model": 2048, "n_layers": 22, "n_heads": 32, "n_kv_heads": 4, "ffn": 5632, "vocab_size": 32000,
            "seq_len": 2048, "batch_size": 8, "lr": 3e-4, "weight_decay": 0.1}


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

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        x = self.embed(idx)
        cos, sin = self.cos[:t], self.sin[:t]
        for block in self.blocks:
            x = block(x, cos, sin)
        return self.lm_head(self.norm(x))


def build_llama(options: dict[str, Any], g: torch.Generator) -> dict[str, Any]:
    """The parts of a :class:`~ampkit.bench.workloads.Workload` for ``llama-1b`` (on the host)."""
    unknown = sorted(set(options) - set(LLAMA_1B))
    if unknown:
        raise UsageError(f"--model llama-1b has no option {', '.join(unknown)}: it takes {', '.join(LLAMA_1B)}")
    o = {**LLAMA_1B, **options}
    if o["d_model"] % o["n_heads"] or o["n_heads"] % o["n_kv_heads"] or (o["d_model"] // o["n_heads"]) % 2:
        raise UsageError("--model llama-1b: d_model must divide into n_heads heads of even size, and n_heads "
                         "into n_kv_heads groups")
    model = LlamaLM(vocab_size=o["vocab_size"], d_model=o["d_model"], n_layers=o["n_layers"], n_heads=o["n_heads"],
                    n_kv_heads=o["n_kv_heads"], ffn=o["ffn"], seq_len=o["seq_len"])
    b, t = o["batch_size"], o["seq_len"]
    batches = [(torch.randint(0, o["vocab_size"], (b, t + 1), generator=g),) for _ in range(4)]

    def loss(m: nn.Module, batch: tuple[torch.Tensor]) -> torch.Tensor:
        tokens = batch[0]
        logits = m(tokens[:, :-1])
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), tokens[:, 1:].reshape(-1))

    n = sum(p.numel() for p in model.parameters())
    size = f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M"
    matmul = n - model.embed.weight.numel()  # the embedding is a lookup
    # 6 per weight and token (forward + backward), plus causal attention's 6 * layers * d * T per token.
    flops = (6 * matmul + 6 * o["n_layers"] * o["d_model"] * t) * b * t
    return {"model": model, "loss": loss, "batches": batches, "flops_per_step": float(flops),
            "tokens_per_step": b * t, "samples_per_step": b, "lr": o["lr"], "weight_decay": o["weight_decay"],
            "make_optimizer": None, "optimizer_name": "AdamW (fused where the device has it)",
            "description": (f"Llama-style decoder ({size}: d={o['d_model']}, {o['n_layers']} layers, "
                            f"{o['n_heads']}/{o['n_kv_heads']} heads, SwiGLU {o['ffn']}, vocab {o['vocab_size']}), "
                            f"{b} x {t} random tokens")}
