"""A small decoder-only transformer with a wide ReLU FFN (naturally sparse activations).

Pre-norm blocks, learned absolute positions, tied input/output embeddings. The shipped
model's FFN is wide (d_ff 3072 = 24 × d_model, set in ``TrainConfig``): a wide FFN is what
makes gathering top-k neurons pay off at batch 1, where a narrow one (1024) did not.
This module holds the parameters and the training forward pass; serving with a KV cache
and the strategy factors lives in :mod:`ablab.inference.runtime.executor`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from ablab.inference.model.lora import LoRAWeights


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int
    d_model: int = 128
    n_heads: int = 4
    n_layers: int = 2
    d_ff: int = 1024
    max_len: int = 64

    def __post_init__(self) -> None:
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    def to_dict(self) -> dict:
        return asdict(self)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.out = nn.Linear(cfg.d_model, cfg.d_model)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.up = nn.Linear(cfg.d_model, cfg.d_ff)
        self.down = nn.Linear(cfg.d_ff, cfg.d_model)

    def forward(self, x: torch.Tensor, lora: LoRAWeights | None = None) -> torch.Tensor:
        return self.ffn(self.attend(x, lora), lora)

    def attend(self, x: torch.Tensor, lora: LoRAWeights | None = None) -> torch.Tensor:
        b, t, d = x.shape
        h = self.ln1(x)
        qkv = self.qkv(h) + (lora.delta("qkv", h) if lora else 0)
        q, k, v = qkv.view(b, t, 3, self.cfg.n_heads, self.cfg.head_dim).permute(2, 0, 3, 1, 4)
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d)
        return x + self.out(att) + (lora.delta("out", att) if lora else 0)

    def ffn(self, x: torch.Tensor, lora: LoRAWeights | None = None) -> torch.Tensor:
        """The FFN half; position-wise, so it may run on any subset of positions ([B, T, d] or [1, N, d])."""
        h = self.ln2(x)
        pre = self.up(h) + (lora.delta("up", h) if lora else 0)
        act = F.relu(pre)
        return x + self.down(act) + (lora.delta("down", act) if lora else 0)


class TinyLM(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_emb = nn.Embedding(cfg.max_len, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        nn.init.normal_(self.tok_emb.weight, std=0.02)
        nn.init.normal_(self.pos_emb.weight, std=0.02)

    def forward(self, idx: torch.Tensor, lora_layers: list[LoRAWeights] | None = None) -> torch.Tensor:
        """Logits [B, T, V] for token ids [B, T] (training and evaluation without a cache)."""
        t = idx.shape[1]
        if t > self.cfg.max_len:
            raise ValueError(f"prompt: {t} tokens exceed the model's max_len {self.cfg.max_len}")
        x = self.tok_emb(idx) + self.pos_emb(torch.arange(t, device=idx.device))
        for i, block in enumerate(self.blocks):
            x = block(x, lora_layers[i] if lora_layers else None)
        return self.logits(self.ln_f(x))

    def selected_logits(self, idx: torch.Tensor, mask: torch.Tensor, lora_layers: list[LoRAWeights] | None = None) -> torch.Tensor:
        """Logits [N, V] at the N positions where `mask` [B, T] is set; equals ``forward(idx)[mask]``.

        Training supervises only the answer tokens, and nothing downstream reads the last
        block's FFN at the other (prompt) positions, so it runs on the selected ones only:
        the wide FFN is most of a training step's cost.
        """
        t = idx.shape[1]
        if t > self.cfg.max_len:
            raise ValueError(f"prompt: {t} tokens exceed the model's max_len {self.cfg.max_len}")
        x = self.tok_emb(idx) + self.pos_emb(torch.arange(t, device=idx.device))
        last = len(self.blocks) - 1
        for i, block in enumerate(self.blocks):
            lora = lora_layers[i] if lora_layers else None
            x = block.attend(x, lora)
            if i == last:
                if lora is not None and lora.a["up"].shape[0] > 1:  # per-row adapters: select after the FFN
                    return self.logits(self.ln_f(block.ffn(x, lora)[mask]))
                x = x[mask].unsqueeze(0)
            x = block.ffn(x, lora)
        return self.logits(self.ln_f(x[0]))

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        return F.linear(h, self.tok_emb.weight)
