"""Attention over a KV cache split into shards along the token axis (flash-decoding style).

Each shard computes its own softmax statistics (running max ``m``, normaliser ``l``) and
un-normalised output; the shards are merged by log-sum-exp, which is exactly softmax
attention over the whole cache. With ``n_shards == 1`` it is plain attention.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def sharded_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, mask: torch.Tensor | None, n_shards: int
) -> torch.Tensor:
    """q: [B,H,Tq,D]; k, v: [B,H,Tk,D]; mask: bool [B|1,1,Tq,Tk] (True = attend) or None."""
    if n_shards < 1:
        raise ValueError(f"kv_shards: must be >= 1, got {n_shards}")
    scale = 1.0 / math.sqrt(q.shape[-1])
    tk = k.shape[2]
    n = min(n_shards, tk)
    if n == 1:  # one fused kernel (same softmax attention; bool mask True = attend)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    bounds = [round(i * tk / n) for i in range(n + 1)]
    outs, maxes, sums = [], [], []
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        scores = torch.matmul(q, k[:, :, lo:hi].transpose(-1, -2)) * scale
        if mask is not None:
            scores = scores.masked_fill(~mask[..., lo:hi], float("-inf"))
        m = scores.amax(dim=-1, keepdim=True)
        m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))  # a fully masked shard adds nothing
        p = torch.exp(scores - m)
        outs.append(torch.matmul(p, v[:, :, lo:hi]))
        maxes.append(m)
        sums.append(p.sum(dim=-1, keepdim=True))
    m_all = torch.stack(maxes).amax(dim=0)
    num = torch.zeros_like(outs[0])
    den = torch.zeros_like(sums[0])
    for o, m, s in zip(outs, maxes, sums):
        w = torch.exp(m - m_all)
        num = num + w * o
        den = den + w * s
    return num / den
