"""Dynamic sparse FFN: per-token top-k neurons chosen *before* the up-projection.

A low-rank predictor (``P1 [d, r]``, ``P2 [r, d_ff]``, initialised from the SVD of the
up-projection and fitted to real pre-activations) scores every neuron cheaply; only the
top-k neurons' rows of the up- and down-projections are gathered and multiplied.
Masking a dense product saves nothing on a CPU (measured 0.8–1.1×; gathering the
selected rows gave 1.7× at d=576, batch 1), so decode steps gather.

The executor uses it for decode steps only (prefill runs the dense FFN). For a decode
step over many sequences a dense product plus a mask of the same selected neurons is
faster than gathering ``rows × k`` rows; both paths compute the same function.

Calibration (``ablab train``, :func:`ablab.inference.training.calibrate_neurons`) adds two
facts per layer about the base model, measured on training-split tokens of every domain:
which neurons ever fire (most frequent first) and how many a token fires at the 99th
percentile. Below k = d_ff a token without an adapter then scores only neurons that fire
at all and takes at most that many: a neuron that does not fire contributes exactly zero,
so computing it is waste, and the batch-1 path keeps the live rows hot-first, so the rows
of common neurons sit together in memory (PowerInfer's hot/cold split). Adapters move
which neurons fire, so their tokens keep plain top-k; k = d_ff still means every neuron.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ablab.inference.model.lora import LoRAWeights

GATHER_MAX_TOKENS = 8  # above this many tokens in one call, mask a dense product instead


@dataclass
class Predictor:
    p1: torch.Tensor  # [d, r]
    p2: torch.Tensor  # [r, d_ff]
    # calibration: neurons that ever fired, most frequent first, and the per-token firing
    # count at the 99th percentile (both None for an uncalibrated predictor)
    neurons: torch.Tensor | None = None
    cap: int | None = None

    def scores(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        if x.dim() == 2:  # one fused kernel for the bias instead of a separate add
            return torch.addmm(bias, torch.mm(x, self.p1), self.p2)
        return torch.matmul(torch.matmul(x, self.p1), self.p2) + bias

    def to(self, device: torch.device | str, dtype: torch.dtype) -> Predictor:
        neurons = None if self.neurons is None else self.neurons.to(device)
        return Predictor(self.p1.to(device, dtype), self.p2.to(device, dtype), neurons, self.cap)

    def plan(self, k: int, d_ff: int) -> tuple[torch.Tensor | None, int]:
        """(neurons the sparse tables keep, or None for all; neurons selected per token)."""
        if self.neurons is None or k >= d_ff:
            return None, k
        return self.neurons, max(1, min(k, self.cap or k, len(self.neurons)))

    def restricted(self, neurons: torch.Tensor | None) -> Predictor:
        """The predictor scoring only `neurons` (in that order), as the tables hold them."""
        if neurons is None:
            return self
        return Predictor(self.p1, self.p2.index_select(1, neurons).contiguous(), neurons, self.cap)


def svd_predictor(w_up: torch.Tensor, rank: int) -> Predictor:
    """Rank-r factorisation of W_up [d_ff, d]: pre-activation ≈ x @ P1 @ P2 + b."""
    u, s, vh = torch.linalg.svd(w_up.float(), full_matrices=False)
    p1 = (vh[:rank].T * s[:rank].sqrt())  # [d, r]
    p2 = (u[:, :rank] * s[:rank].sqrt()).T  # [r, d_ff]
    return Predictor(p1.contiguous(), p2.contiguous())


@dataclass
class FFNTables:
    """FFN weights laid out for row gathers; int8 rows carry a per-row scale.

    Row i holds neuron ``neurons[i]`` (all neurons in order when ``neurons`` is None): the
    batch-1 path's tables keep only live neurons; :func:`sparse_ffn` needs all of them."""

    up_w: torch.Tensor  # [d_ff, d]
    up_b: torch.Tensor  # [d_ff]
    down_wt: torch.Tensor  # [d_ff, d]  (down-projection transposed: a neuron is a row)
    down_b: torch.Tensor  # [d]
    up_scale: torch.Tensor | None = None
    down_scale: torch.Tensor | None = None
    # float tables also keep each neuron's up row with its bias appended [d_ff, d + 1]: a
    # decode step then gathers up rows once (one matrix-vector product against [h, 1]) and
    # sums the selected down rows weighted by the activations in one embedding_bag, which
    # reads them in place (no gathered copy). At batch 1 the step is bound by kernel count
    # and memory traffic, not by FLOPs.
    up_aug: torch.Tensor | None = None
    neurons: torch.Tensor | None = None

    @classmethod
    def from_linear(
        cls, up: torch.nn.Linear, down: torch.nn.Linear, *, dtype: torch.dtype, int8: bool, neurons: torch.Tensor | None = None
    ) -> FFNTables:
        up_w = up.weight.detach().float()
        up_b = up.bias.detach().float()
        down_wt = down.weight.detach().float().T
        if neurons is not None:
            up_w, up_b, down_wt = up_w[neurons], up_b[neurons], down_wt[neurons]
        down_wt = down_wt.contiguous()
        down_b = down.bias.detach()
        if not int8:
            up_aug = torch.cat([up_w, up_b[:, None]], dim=1).to(dtype).contiguous()
            return cls(up_w.to(dtype), up_b.to(dtype), down_wt.to(dtype), down_b.to(dtype), up_aug=up_aug, neurons=neurons)
        up_q, up_s = _quantize_rows(up_w)
        down_q, down_s = _quantize_rows(down_wt)
        return cls(up_q, up_b, down_q, down_b.float(), up_s, down_s, neurons=neurons)

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


@dataclass(frozen=True)
class BaseCalibration:
    """How a token without an adapter selects: only live neurons, at most `k` of them."""

    penalty: torch.Tensor  # [d_ff]: 0 for neurons that fired in calibration, -inf for the rest
    k: int

    @classmethod
    def of(cls, neurons: torch.Tensor, k: int, *, d_ff: int, dtype: torch.dtype, device) -> BaseCalibration:
        penalty = torch.full((d_ff,), float("-inf"), dtype=dtype, device=device)
        penalty[neurons.to(device)] = 0
        return cls(penalty, k)


def select_neurons(
    x: torch.Tensor, predictor: Predictor, bias: torch.Tensor, k: int, *, base: BaseCalibration | None = None, base_tokens: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per token, the k neurons with the largest predicted pre-activation: indices [N, k],
    and a 0/1 weight [N, k] when some of them must not count (None: all count).

    With `base`, tokens without an adapter (`base_tokens` [N] bool; None: every token)
    choose among live neurons only and keep at most ``base.k``."""
    scores = predictor.scores(x, bias)
    if base is None:
        return scores.topk(k, dim=-1, sorted=False).indices, None
    if base_tokens is None:
        return (scores + base.penalty).topk(base.k, dim=-1, sorted=False).indices, None
    scores = torch.where(base_tokens[:, None], scores + base.penalty, scores)
    top = scores.topk(k, dim=-1, sorted=True)
    rank_ok = torch.arange(k, device=x.device) < base.k
    keep = (~base_tokens[:, None] | rank_ok) & torch.isfinite(top.values)
    return top.indices, keep.to(x.dtype)


def sparse_ffn(
    x: torch.Tensor,
    *,
    tables: FFNTables,
    predictor: Predictor,
    k: int,
    up: Callable[[torch.Tensor], torch.Tensor],
    down: Callable[[torch.Tensor], torch.Tensor],
    lora: LoRAWeights | None = None,
    base: BaseCalibration | None = None,
    base_tokens: torch.Tensor | None = None,
) -> torch.Tensor:
    """x: [B, T, d] → [B, T, d] using only k neurons per token.

    `up`/`down` are the dense projections (with bias) the many-token path uses instead of
    the tables (the executor passes its fp32 or int8 kernels); `base`/`base_tokens` as in
    :func:`select_neurons`."""
    if tables.neurons is not None:
        raise ValueError("sparse_ffn: needs tables of every neuron (adapter factors and dense masks index all of d_ff)")
    b, t, d = x.shape
    idx, keep = select_neurons(x.reshape(b * t, d), predictor, tables.up_b, k, base=base, base_tokens=base_tokens)
    if lora is None and keep is None and tables.up_aug is not None and b * t <= GATHER_MAX_TOKENS:
        return gathered_ffn(x.reshape(b * t, d), tables=tables, idx=idx).view(b, t, d)
    if b * t > GATHER_MAX_TOKENS:
        return _masked_dense(x, neurons=idx, keep=keep, lora=lora, up=up, down=down)
    flat = x.reshape(b * t, d)
    w_up = tables.rows("up", idx).to(flat.dtype)  # [N, k, d]
    pre = torch.matmul(w_up, flat.unsqueeze(-1)).squeeze(-1) + tables.up_b.index_select(0, idx.reshape(-1)).view(idx.shape)
    if lora is not None:
        # rows of the batch map to tokens; each token gathers its adapter's B rows for its neurons
        u = lora.delta_input("up", x).reshape(b * t, -1)  # [N, r]
        b_up = lora.b["up"].repeat_interleave(t, dim=0) if lora.b["up"].shape[0] == b else lora.b["up"].expand(b * t, -1, -1)
        b_sel = torch.gather(b_up, 1, idx.unsqueeze(-1).expand(-1, -1, b_up.shape[-1]))  # [N, k, r]
        pre = pre + torch.matmul(b_sel, u.unsqueeze(-1)).squeeze(-1) * lora.scale
    h = F.relu(pre) if keep is None else F.relu(pre) * keep
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


def gathered_ffn(x: torch.Tensor, *, tables: FFNTables, idx: torch.Tensor) -> torch.Tensor:
    """The no-adapter decode FFN over float tables: x [N, d], idx [N, k] table rows → [N, d]."""
    n, k = idx.shape
    d = x.shape[1]
    x_aug = torch.cat([x, x.new_ones(n, 1)], dim=1)  # the appended 1 picks up each row's bias
    if n == 1:  # a matrix-vector product is cheaper than a batch of one
        act = torch.mv(tables.up_aug.index_select(0, idx[0]), x_aug[0]).relu_().view(1, k)
    else:
        rows = tables.up_aug.index_select(0, idx.reshape(-1)).view(n, k, d + 1)
        act = torch.bmm(rows, x_aug.unsqueeze(-1)).view(n, k).relu_()
    # one bag per token (2-D input): the weighted sum of its selected down rows
    return F.embedding_bag(idx, tables.down_wt, per_sample_weights=act, mode="sum").add_(tables.down_b)


def _masked_dense(x: torch.Tensor, *, neurons: torch.Tensor, keep: torch.Tensor | None, lora: LoRAWeights | None, up, down) -> torch.Tensor:
    """The dense product with every unselected neuron zeroed (`neurons`: model ids [N, k])."""
    b, t, _ = x.shape
    pre = up(x) + (lora.delta("up", x) if lora is not None else 0)
    mask = torch.zeros(b * t, pre.shape[-1], dtype=pre.dtype, device=x.device)
    mask.scatter_(1, neurons, 1.0 if keep is None else keep.to(pre.dtype))
    h = F.relu(pre) * mask.reshape(b, t, -1)
    return down(h) + (lora.delta("down", h) if lora is not None else 0)
