"""LoRA adapters: low-rank deltas on the qkv, out, up and down projections.

Serving stacks every loaded adapter into one bank with a zero adapter at row 0, so a batch
can mix requests on different adapters (and on none): each row gathers its own A and B
(Punica-style). The base weights are never touched.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

TARGETS = ("qkv", "out", "up", "down")


@dataclass
class LoRAWeights:
    """Per-row adapter factors for one layer: A [B|1, r, d_in], B [B|1, d_out, r] per target."""

    a: dict[str, torch.Tensor]
    b: dict[str, torch.Tensor]
    scale: float

    def delta(self, target: str, x: torch.Tensor) -> torch.Tensor:
        """x: [B, T, d_in] → [B, T, d_out]."""
        a, b = self.a[target], self.b[target]
        return torch.matmul(torch.matmul(x, a.transpose(1, 2)), b.transpose(1, 2)) * self.scale

    def delta_input(self, target: str, x: torch.Tensor) -> torch.Tensor:
        """The rank-r projection x @ A^T: [B, T, r] (the sparse FFN applies B per neuron)."""
        return torch.matmul(x, self.a[target].transpose(1, 2))


def target_shapes(d_model: int, d_ff: int) -> dict[str, tuple[int, int]]:
    """(d_in, d_out) per target."""
    return {"qkv": (d_model, 3 * d_model), "out": (d_model, d_model), "up": (d_model, d_ff), "down": (d_ff, d_model)}


def init_adapter(*, n_layers: int, d_model: int, d_ff: int, rank: int, seed: int) -> list[dict[str, torch.Tensor]]:
    """A fresh adapter: A small random, B = 0, so it starts equal to the base."""
    gen = torch.Generator().manual_seed(seed)
    layers = []
    for _ in range(n_layers):
        params: dict[str, torch.Tensor] = {}
        for target, (d_in, d_out) in target_shapes(d_model, d_ff).items():
            params[f"{target}.a"] = torch.randn(rank, d_in, generator=gen) / d_in**0.5
            params[f"{target}.b"] = torch.zeros(d_out, rank)
        layers.append(params)
    return layers


class AdapterBank:
    """All served adapters stacked per layer; row 0 is the zero adapter (= base model)."""

    def __init__(self, adapters: dict[str, dict], *, n_layers: int, d_model: int, d_ff: int, dtype=torch.float32):
        self.names: list[str] = [None, *sorted(adapters)]  # type: ignore[list-item]
        ranks = {a["rank"] for a in adapters.values()}
        if len(ranks) > 1:
            raise ValueError(f"lora_adapter: adapters in one bank must share a rank, got {sorted(ranks)}")
        self.rank = ranks.pop() if ranks else 1
        alphas = {a["alpha"] for a in adapters.values()}
        self.scale = (alphas.pop() if alphas else 1.0) / self.rank
        shapes = target_shapes(d_model, d_ff)
        self.layers: list[dict[str, torch.Tensor]] = []
        for layer in range(n_layers):
            stacked: dict[str, torch.Tensor] = {}
            for target, (d_in, d_out) in shapes.items():
                a_rows = [torch.zeros(self.rank, d_in)]
                b_rows = [torch.zeros(d_out, self.rank)]
                for name in self.names[1:]:
                    a_rows.append(adapters[name]["layers"][layer][f"{target}.a"].float())
                    b_rows.append(adapters[name]["layers"][layer][f"{target}.b"].float())
                stacked[f"{target}.a"] = torch.stack(a_rows).to(dtype)
                stacked[f"{target}.b"] = torch.stack(b_rows).to(dtype)
            self.layers.append(stacked)

    def index(self, name: str | None) -> int:
        if name not in self.names:
            raise KeyError(f"lora_adapter: no adapter named {name!r}; loaded: {self.names[1:]}")
        return self.names.index(name)

    def weights(self, layer: int, rows: torch.Tensor) -> LoRAWeights | None:
        """Factors for a batch whose row i uses adapter ``rows[i]``; None when no row has one."""
        if len(self.names) == 1 or not bool((rows > 0).any()):
            return None
        bank = self.layers[layer]
        a = {t: bank[f"{t}.a"].index_select(0, rows) for t in TARGETS}
        b = {t: bank[f"{t}.b"].index_select(0, rows) for t in TARGETS}
        return LoRAWeights(a=a, b=b, scale=self.scale)
