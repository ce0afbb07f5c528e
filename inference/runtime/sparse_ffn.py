"""Dynamic sparse FFN: per-token top-k neurons chosen *before* the up-projection.

A low-rank predictor (``P1 [d, r]``, ``P2 [r, d_ff]``, initialised from the SVD of the
up-projection and fitted to real pre-activations) scores every neuron cheaply; only the
top-k neurons' rows of the up- and down-projections are gathered and multiplied.
Masking a dense product would save nothing (DESIGN.md), so decode steps gather.

The executor uses it for decode steps only (prefill runs the dense FFN). For a decode
step over many sequences a dense product plus a mask of the same selected neurons is
faster than gathering ``rows × k`` rows; both paths compute the same function.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ablab.inference.runtime.lora import LoRAWeights

GATHER_MAX_TOKENS = 8  # above this many tokens in one call, mask a dense product instead


@dataclass
class Predictor:
    p1: torch.Tensor  # [d, r]
    p2: torch.Tensor  # [r, d_ff]

    def scores(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        if x.dim() == 2:  # one fused kernel for the bias instead of a separate add
            return torch.addmm(bias, torch.mm(x, self.p1), self.p2)
        return torch.matmul(torch.matmul(x, self.p1), self.p2) + bias

    def to(self, dtype: torch.dtype) -> "Predictor":
        return Predictor(self.p1.to(dtype), self.p2.to(dtype))


def svd_predictor(w_up: torch.Tensor, rank: int) -> Predictor:
    """Rank-r factorisation of W_up [d_ff, d]: pre-activation ≈ x @ P1 @ P2 + b."""
    u, s, vh = torch.linalg.svd(w_up.float(), full_matrices=False)
    p1 = (vh[:rank].T * s[:rank].sqrt())  # [d, r]
    p2 = (u[:, :rank] * s[:rank].sqrt()).T  # [r, d_ff]
    return Predictor(p1.contiguous(), p2.contiguous())


@dataclass
class FFNTables:
    """FFN weights laid out for row gathers; int8 rows carry a per-row scale."""

    up_w: torch.Tensor  # [d_ff, d]
    up_b: torch.Tensor  # [d_ff]
    down_wt: torch.Tensor  # [d_ff, d]  (down-projection transposed: a neuron is a row)
    down_b: torch.Tensor  # [d]
    up_scale: torch.Tensor | None = None
    down_scale: torch.Tensor | None = None
    # float tables also keep one packed row per neuron [up row | up bias | down row], so a
    # decode step gathers once and runs two matrix-vector kernels: at batch 1 the step is
    # bound by kernel count, not by FLOPs
    packed: torch.Tensor | None = None

    @classmethod
    def from_linear(cls, up: torch.nn.Linear, down: torch.nn.Linear, *, dtype: torch.dtype, int8: bool) -> "FFNTables":
        up_w = up.weight.detach().float()
        down_wt = down.weight.detach().float().T.contiguous()
        if not int8:
            packed = torch.cat([up_w, up.bias.detach().float()[:, None], down_wt], dim=1).to(dtype).contiguous()
            return cls(up_w.to(dtype), up.bias.detach().to(dtype), down_wt.to(dtype), down.bias.detach().to(dtype), packed=packed)
        up_q, up_s = _quantize_rows(up_w)
        down_q, down_s = _quantize_rows(down_wt)
        return cls(up_q, up.bias.detach().float(), down_q, down.bias.detach().float(), up_s, down_s)

    def rows(self, which: str, idx: torch.Tensor) -> torch.Tensor:
        table = self.up_w if which == "up" else self.down_wt
        scale = self.up_scale if which == "up" else self.down_scale
        # index_select on a flat index is several times faster than advanced indexing
        flat = idx.reshape(-1)
        gathered = table.index_select(0, flat).view(*idx.shape, table.shape[1])
        if scale is None:
            return gathered
        return gathered.float() * scale.index_select(0, flat).view(*idx.shape, 1)


def _quantize_rows(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    scale = w.abs().amax(dim=1).clamp_min(1e-8) / 127.0
    return torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8), scale


def select_neurons(x: torch.Tensor, predictor: Predictor, bias: torch.Tensor, k: int) -> torch.Tensor:
    """Indices [N, k] of the k neurons with the largest predicted pre-activation per token."""
    return predictor.scores(x, bias).topk(k, dim=-1, sorted=False).indices


def sparse_ffn(
    x: torch.Tensor,
    *,
    tables: FFNTables,
    predictor: Predictor,
    k: int,
    lora: LoRAWeights | None = None,
    up: Callable[[torch.Tensor], torch.Tensor] | None = None,
    down: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> torch.Tensor:
    """x: [B, T, d] → [B, T, d] using only k neurons per token.

    `up`/`down` are the dense projections (with bias) the many-token path may use instead
    of the tables (the executor passes its fp32 or int8 kernels)."""
    b, t, d = x.shape
    idx = select_neurons(x.reshape(b * t, d), predictor, tables.up_b, k)  # [N, k]
    if lora is None and tables.packed is not None and b * t <= GATHER_MAX_TOKENS:
        return _gathered_packed(x, tables=tables, idx=idx)
    if b * t > GATHER_MAX_TOKENS:
        return _masked_dense(x, tables=tables, idx=idx, lora=lora, up=up, down=down)
    flat = x.reshape(b * t, d)
    w_up = tables.rows("up", idx).to(flat.dtype)  # [N, k, d]
    pre = torch.matmul(w_up, flat.unsqueeze(-1)).squeeze(-1) + tables.up_b.index_select(0, idx.reshape(-1)).view(idx.shape)
    if lora is not None:
        # rows of the batch map to tokens; each token gathers its adapter's B rows for its neurons
        u = lora.delta_input("up", x).reshape(b * t, -1)  # [N, r]
        b_up = lora.b["up"].repeat_interleave(t, dim=0) if lora.b["up"].shape[0] == b else lora.b["up"].expand(b * t, -1, -1)
        b_sel = torch.gather(b_up, 1, idx.unsqueeze(-1).expand(-1, -1, b_up.shape[-1]))  # [N, k, r]
        pre = pre + torch.matmul(b_sel, u.unsqueeze(-1)).squeeze(-1) * lora.scale
    h = F.relu(pre)
    w_down = tables.rows("down", idx).to(flat.dtype)  # [N, k, d]
    y = torch.matmul(h.unsqueeze(1), w_down).squeeze(1) + tables.down_b
    if lora is not None:
        a_down = lora.a["down"]  # [B|1, r, d_ff]
        a_down = a_down.repeat_interleave(t, dim=0) if a_down.shape[0] == b else a_down.expand(b * t, -1, -1)
        a_sel = torch.gather(a_down, 2, idx.unsqueeze(1).expand(-1, a_down.shape[1], -1))  # [N, r, k]
        z = torch.matmul(a_sel, h.unsqueeze(-1)).squeeze(-1)  # [N, r]
        b_down = lora.b["down"]
        b_down = b_down.repeat_interleave(t, dim=0) if b_down.shape[0] == b else b_down.expand(b * t, -1, -1)
        y = y + torch.matmul(b_down, z.unsqueeze(-1)).squeeze(-1) * lora.scale
    return y.reshape(b, t, d)


def _gathered_packed(x: torch.Tensor, *, tables: FFNTables, idx: torch.Tensor) -> torch.Tensor:
    """The no-adapter decode path: one gather of packed rows, then fused multiply-adds."""
    b, t, d = x.shape
    packed = tables.packed
    if b * t == 1:
        rows = packed.index_select(0, idx[0])  # [k, 2d+1]
        h = torch.addmv(rows[:, d], rows[:, :d], x.reshape(d)).relu_()
        return torch.addmv(tables.down_b, rows[:, d + 1 :].t(), h).view(b, t, d)
    n, k = idx.shape
    rows = packed.index_select(0, idx.reshape(-1)).view(n, k, 2 * d + 1)
    pre = torch.baddbmm(rows[:, :, d : d + 1], rows[:, :, :d], x.reshape(n, d, 1))  # [N, k, 1]
    y = torch.bmm(pre.relu_().transpose(1, 2), rows[:, :, d + 1 :]).view(n, d) + tables.down_b
    return y.view(b, t, d)


def _masked_dense(x: torch.Tensor, *, tables: FFNTables, idx: torch.Tensor, lora: LoRAWeights | None, up=None, down=None) -> torch.Tensor:
    b, t, d = x.shape
    d_ff = tables.up_b.shape[0]
    if up is not None and down is not None:
        pre = up(x) + (lora.delta("up", x) if lora is not None else 0)
        keep = torch.zeros(b * t, d_ff, dtype=torch.bool, device=x.device).scatter_(1, idx, True).reshape(b, t, -1)
        h = F.relu(pre) * keep
        return down(h) + (lora.delta("down", h) if lora is not None else 0)
    up_w = tables.rows("up", torch.arange(tables.up_w.shape[0])).to(x.dtype)
    pre = torch.matmul(x, up_w.T) + tables.up_b
    if lora is not None:
        pre = pre + lora.delta("up", x)
    keep = torch.zeros(b * t, up_w.shape[0], dtype=torch.bool).scatter_(1, idx, True).reshape(b, t, -1)
    h = F.relu(pre) * keep
    down_wt = tables.rows("down", torch.arange(tables.down_wt.shape[0])).to(x.dtype)
    y = torch.matmul(h, down_wt) + tables.down_b
    if lora is not None:
        y = y + lora.delta("down", h)
    return y
