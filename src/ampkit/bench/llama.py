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
from ampkit.tasks.llama import LlamaLM, check_shape

__all__ = ["LLAMA_1B", "LlamaLM", "build_llama"]  # LlamaLM lives in ampkit.tasks.llama

LLAMA_1B = {"d_model": 2048, "n_layers": 22, "n_heads": 32, "n_kv_heads": 4, "ffn": 5632, "vocab_size": 32000,
            "seq_len": 2048, "batch_size": 8, "lr": 3e-4, "weight_decay": 0.1}


def build_llama(options: dict[str, Any], g: torch.Generator) -> dict[str, Any]:
    """The parts of a :class:`~ampkit.bench.workloads.Workload` for ``llama-1b`` (on the host)."""
    unknown = sorted(set(options) - set(LLAMA_1B))
    if unknown:
        raise UsageError(f"--model llama-1b has no option {', '.join(unknown)}: it takes {', '.join(LLAMA_1B)}")
    o = {**LLAMA_1B, **options}
    check_shape(o["d_model"], o["n_heads"], o["n_kv_heads"])
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
