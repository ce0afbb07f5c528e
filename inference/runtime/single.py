"""Decode steps without adapters, written for the fewest kernel launches (batch 1, and a
few sequences at once).

At batch 1 on a CPU a decode step of the shipped model is bound by how many torch ops it
launches (a few µs of dispatch each), not by FLOPs: the general path in
:mod:`ablab.inference.runtime.executor` serves any batch, padding and adapter mix and pays
for that generality in views, masks and module calls on every layer. This path handles
the most common serving case, one sequence without an adapter, and computes the same
function with a quarter fewer aten calls (208 against 275 per dense step, nested calls
included, torch profiler) and no module calls:

- weights are plain tensors held per layer (no ``nn.Module`` calls), pre-transposed so each
  projection is one ``addmm`` that also adds the residual stream (no ``linear`` → ``t``
  → ``addmm`` → ``add``);
- the attention scale is folded into the query rows of the QKV projection;
- attention over the slot's cache is two ``bmm`` and a softmax (no mask: the cache
  holds exactly the positions the token may see);
- the sparse FFN is one gather of up rows (bias appended), one matrix-vector product and
  one ``embedding_bag`` that sums the selected down rows in place, with its offsets and
  the bias's 1 allocated once (an ``arange`` per call cost 10 % of the step), over tables
  that hold only the base model's live neurons, hot first; the dense FFN is two ``addmm``.

``step_many`` is the same layer for a few sequences (continuous batching's usual decode
step): cache views when the slots form one range, index writes and gathers otherwise, and a
length mask only when the lengths differ. It is float-only (int8 picks its kernels by token
count on the general path) and, for the sparse FFN, limited to ``GATHER_MAX_TOKENS``.

Both the dense and the sparse configuration take these paths, so the sparse-vs-dense ratio
compares FFNs, not code paths. Tests pin both to the general path (max abs diff ≤ 1e-5).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ablab.inference.runtime.attention import sharded_attention
from ablab.inference.runtime.sparse_ffn import FFNTables, Predictor


@dataclass(frozen=True)
class _Layer:
    ln1: tuple[torch.Tensor, torch.Tensor, float]  # weight, bias, eps: F.layer_norm's order
    qkv_wt: torch.Tensor  # [d, 3d], query columns pre-scaled by 1/sqrt(head_dim)
    qkv_b: torch.Tensor
    out_wt: torch.Tensor  # [d, d]
    out_b: torch.Tensor
    ln2: tuple[torch.Tensor, torch.Tensor, float]
    # dense FFN: float weights (pre-transposed), or a dynamic-int8 module where it wins at one token
    up_wt: torch.Tensor
    up_b: torch.Tensor
    down_wt: torch.Tensor
    down_b: torch.Tensor
    up_int8: Callable[[torch.Tensor], torch.Tensor] | None
    down_int8: Callable[[torch.Tensor], torch.Tensor] | None
    tables: FFNTables | None  # sparse FFN (live neurons' rows + predictor)
    predictor: Predictor | None
    k: int  # neurons per token in this layer (sparse only)


class SingleDecode:
    """``step(token, pos, pool, slot)`` → logits [1, V], equal to ``Executor.decode`` at b = 1;
    ``step_many`` does the same for a few sequences without adapters (float weights)."""

    def __init__(
        self, model, *, int8_ffn: list[tuple[Callable | None, Callable | None]], tables: list[FFNTables], predictors: list[Predictor], ks: list[int], n_shards: int
    ):
        cfg = model.cfg
        self.d, self.h, self.hd = cfg.d_model, cfg.n_heads, cfg.head_dim
        self.n_shards = n_shards
        self.tok_emb = model.tok_emb.weight
        self.tok_emb_t = self.tok_emb.t()  # the tied LM head
        self._one = self.tok_emb.new_ones(1)  # appended to h: picks up each gathered row's bias
        self._bag = torch.zeros(1, dtype=torch.long, device=self.tok_emb.device)  # one bag at offset 0
        self.pos_emb = model.pos_emb.weight
        self.ln_f = (model.ln_f.weight, model.ln_f.bias, model.ln_f.eps)
        scale = 1.0 / math.sqrt(cfg.head_dim)
        sparse = bool(ks)
        self.layers: list[_Layer] = []
        for j, blk in enumerate(model.blocks):
            qkv_w = blk.qkv.weight.detach().clone()
            qkv_b = blk.qkv.bias.detach().clone()
            # sharded attention applies its own scale; fold it in only for the plain path
            if n_shards == 1:
                qkv_w[: cfg.d_model] *= scale
                qkv_b[: cfg.d_model] *= scale
            self.layers.append(
                _Layer(
                    ln1=(blk.ln1.weight, blk.ln1.bias, blk.ln1.eps),
                    qkv_wt=qkv_w.t(),
                    qkv_b=qkv_b,
                    out_wt=blk.out.weight.t(),
                    out_b=blk.out.bias,
                    ln2=(blk.ln2.weight, blk.ln2.bias, blk.ln2.eps),
                    up_wt=blk.up.weight.t(),
                    up_b=blk.up.bias,
                    down_wt=blk.down.weight.t(),
                    down_b=blk.down.bias,
                    up_int8=int8_ffn[j][0],
                    down_int8=int8_ffn[j][1],
                    tables=tables[j] if sparse else None,
                    predictor=predictors[j] if sparse else None,
                    k=ks[j] if sparse else 0,
                )
            )

    def step(self, token: int, pos: int, *, k_cache: list[torch.Tensor], v_cache: list[torch.Tensor], slot: int) -> torch.Tensor:
        d, n_heads, hd = self.d, self.h, self.hd
        x = (self.tok_emb[token] + self.pos_emb[pos]).view(1, d)
        for j, lay in enumerate(self.layers):
            h = F.layer_norm(x, (d,), *lay.ln1)
            q, k, v = torch.addmm(lay.qkv_b, h, lay.qkv_wt).view(3, n_heads, hd)
            kc, vc = k_cache[j][slot], v_cache[j][slot]  # [H, max_len, hd] views into the pool
            kc[:, pos] = k
            vc[:, pos] = v
            keys, values = kc[:, : pos + 1], vc[:, : pos + 1]
            if self.n_shards == 1:
                p = torch.bmm(keys, q.unsqueeze(-1)).softmax(dim=1)  # [H, tk, 1]
                att = torch.bmm(p.transpose(1, 2), values).view(1, d)
            else:
                att = sharded_attention(q[None, :, None], keys[None], values[None], mask=None, n_shards=self.n_shards).view(1, d)
            x = torch.addmm(x, att, lay.out_wt).add_(lay.out_b)
            h = F.layer_norm(x, (d,), *lay.ln2)
            if lay.tables is None:
                act = (torch.addmm(lay.up_b, h, lay.up_wt) if lay.up_int8 is None else lay.up_int8(h)).relu_()
                x = torch.addmm(x, act, lay.down_wt).add_(lay.down_b) if lay.down_int8 is None else x + lay.down_int8(act)
                continue
            t, pr = lay.tables, lay.predictor
            idx = torch.addmm(t.up_b, torch.mm(h, pr.p1), pr.p2).topk(lay.k, sorted=False).indices[0]
            act = torch.mv(t.up_aug.index_select(0, idx), torch.cat([h[0], self._one])).relu_()
            x = F.embedding_bag(idx, t.down_wt, self._bag, per_sample_weights=act, mode="sum").add_(x).add_(t.down_b)
        h = F.layer_norm(x, (d,), *self.ln_f)
        return torch.mm(h, self.tok_emb_t).float()

    def step_many(self, tokens: list[int], positions: list[int], *, k_cache: list[torch.Tensor], v_cache: list[torch.Tensor], slots: list[int]) -> torch.Tensor:
        """One decode step for b sequences without adapters (float weights): token i goes at
        position ``positions[i]`` of cache slot ``slots[i]``. Logits [b, V]."""
        d, n_heads, hd = self.d, self.h, self.hd
        b = len(tokens)
        dev = self.tok_emb.device
        pos_t = torch.tensor(positions, device=dev)
        slot_t = torch.tensor(slots, device=dev)
        tk = max(positions) + 1
        x = self.tok_emb.index_select(0, torch.tensor(tokens, device=dev)) + self.pos_emb.index_select(0, pos_t)
        # a row attends to its own positions only; equal lengths need no mask
        same_pos = min(positions) == max(positions)
        mask = None if same_pos else torch.arange(tk, device=dev)[None, :] <= pos_t[:, None]  # [b, tk]
        # the pool hands out low slots first, so a batch's slots are usually one range: views
        # then replace the gather of every row's cache
        run = slots == list(range(slots[0], slots[0] + b))
        cache_rows = slice(slots[0], slots[0] + b) if run else slot_t
        for j, lay in enumerate(self.layers):
            h = F.layer_norm(x, (d,), *lay.ln1)
            q, k, v = torch.addmm(lay.qkv_b, h, lay.qkv_wt).view(b, 3, n_heads, hd).unbind(1)  # [b, H, hd] each
            if run and same_pos:
                k_cache[j][cache_rows, :, positions[0]] = k
                v_cache[j][cache_rows, :, positions[0]] = v
            else:
                k_cache[j][slot_t, :, pos_t] = k
                v_cache[j][slot_t, :, pos_t] = v
            keys = k_cache[j][cache_rows, :, :tk]  # [b, H, tk, hd]
            values = v_cache[j][cache_rows, :, :tk]
            if self.n_shards == 1:
                scores = torch.matmul(keys, q.unsqueeze(-1)).squeeze(-1)  # [b, H, tk]
                if mask is not None:
                    scores = scores.masked_fill(~mask[:, None, :], float("-inf"))
                att = torch.matmul(scores.softmax(dim=-1).unsqueeze(-2), values).view(b, d)
            else:
                m = None if mask is None else mask[:, None, None, :]
                att = sharded_attention(q.unsqueeze(2), keys, values, mask=m, n_shards=self.n_shards).view(b, d)
            x = torch.addmm(x, att, lay.out_wt).add_(lay.out_b)
            h = F.layer_norm(x, (d,), *lay.ln2)
            if lay.tables is None:
                x = torch.addmm(x, torch.addmm(lay.up_b, h, lay.up_wt).relu_(), lay.down_wt).add_(lay.down_b)
                continue
            t, pr = lay.tables, lay.predictor
            idx = torch.addmm(t.up_b, torch.mm(h, pr.p1), pr.p2).topk(lay.k, sorted=False).indices  # [b, k]
            rows = t.up_aug.index_select(0, idx.reshape(-1)).view(b, lay.k, d + 1)
            act = torch.bmm(rows, torch.cat([h, self._one.expand(b, 1)], dim=1).unsqueeze(-1)).view(b, lay.k).relu_()
            x = F.embedding_bag(idx, t.down_wt, per_sample_weights=act, mode="sum").add_(x).add_(t.down_b)
        h = F.layer_norm(x, (d,), *self.ln_f)
        return torch.mm(h, self.tok_emb_t).float()
