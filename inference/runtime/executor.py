"""Executes prefill and decode steps of the shipped model under one runtime configuration.

An :class:`Executor` is built once per (precision, sparse_ffn_k, kv_shards, adapters) and
holds the variant's weights; it never decides *what* to run (that is the scheduler's
job in :mod:`ablab.inference.engine`). KV caches live in a slot pool so a decode step
over many sequences is one batched call; decode steps without adapters (one sequence, or a
few in float) run through :mod:`ablab.inference.runtime.single`, the same function in fewer
kernels.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from ablab.inference.model.lora import AdapterBank, LoRAWeights
from ablab.inference.model.transformer import TinyLM
from ablab.inference.runtime.attention import sharded_attention
from ablab.inference.runtime.precision import INT8_MIN_TOKENS, INT8_SPARSE_GATHER, use_int8
from ablab.inference.runtime.single import SingleDecode
from ablab.inference.runtime.sparse_ffn import GATHER_MAX_TOKENS, BaseCalibration, FFNTables, Predictor, sparse_ffn

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "int8": torch.float32}


@dataclass(frozen=True)
class RuntimeConfig:
    precision: str = "fp32"
    sparse_ffn_k: int | None = None
    kv_shards: int = 1


class KVPool:
    """Per-layer K and V tensors [slots, H, max_len, head_dim]; a sequence owns one slot."""

    def __init__(self, *, n_layers: int, slots: int, n_heads: int, max_len: int, head_dim: int, dtype, device):
        shape = (slots, n_heads, max_len, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self.free = list(range(slots))[::-1]

    def acquire(self) -> int:
        if not self.free:
            raise RuntimeError("KV pool exhausted: more active sequences than slots")
        return self.free.pop()

    def release(self, slot: int) -> None:
        self.free.append(slot)
        self.free.sort(reverse=True)  # hand out low slots first, so active slots stay contiguous


def quantize_int8(model: TinyLM) -> TinyLM:
    """Dynamic INT8: Linear weights stored int8, activations quantized per call (fbgemm)."""
    import warnings

    from torch.ao.quantization import quantize_dynamic

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return quantize_dynamic(copy.deepcopy(model), {nn.Linear}, dtype=torch.qint8)


class Executor:
    def __init__(
        self,
        model: TinyLM,
        *,
        runtime: RuntimeConfig,
        predictors: list[Predictor] | None = None,
        adapters: dict[str, dict] | None = None,
        device: str | torch.device = "cpu",
        int8_min_tokens: dict[str, int] | None = None,
        few_kernel: bool = True,
    ):
        """`few_kernel=False` keeps every decode step on the general path (tests compare the two)."""
        cfg = model.cfg
        self.cfg = cfg
        self.runtime = runtime
        self.device = torch.device(device)
        self.dtype = DTYPES[runtime.precision]
        fp = copy.deepcopy(model).to(self.device).eval()
        # int8: the fp32 model plus int8 copies of every projection; each call takes the
        # kernel that is faster for its size (runtime/precision.py)
        self._int8: dict[tuple[int, str], nn.Module] = {}
        self.int8_min_tokens = dict(int8_min_tokens or INT8_MIN_TOKENS)
        if runtime.precision == "int8":
            if self.device.type != "cpu":
                raise ValueError("precision: int8 dynamic quantization runs on CPU only")
            q = quantize_int8(fp)
            self._int8 = {(j, name): getattr(blk, name) for j, blk in enumerate(q.blocks) for name in ("qkv", "out", "up", "down")}
            self.model = fp
        else:
            self.model = fp.to(self.dtype)
        self.tables: list[FFNTables] = []
        self.predictors: list[Predictor] = []
        # tokens without an adapter select among the base model's live neurons (calibrated
        # predictors only; runtime/sparse_ffn.py); the batch-1 path keeps only those rows
        self.base_calibration: list[BaseCalibration | None] = []
        single_tables: list[FFNTables] = []
        single_predictors: list[Predictor] = []
        single_k: list[int] = []
        if runtime.sparse_ffn_k is not None:
            if predictors is None:
                raise ValueError("sparse_ffn_k: needs the shipped neuron predictor")
            int8_rows = runtime.precision == "int8" and INT8_SPARSE_GATHER
            for blk, pred in zip(fp.blocks, predictors):
                self.tables.append(FFNTables.from_linear(blk.up, blk.down, dtype=self.dtype, int8=int8_rows))
                self.predictors.append(pred.to(self.device, self.dtype))
                neurons, k = pred.plan(runtime.sparse_ffn_k, cfg.d_ff)
                calibration = None if neurons is None else BaseCalibration.of(neurons, k, d_ff=cfg.d_ff, dtype=self.dtype, device=self.device)
                self.base_calibration.append(calibration)
                single_tables.append(self.tables[-1] if neurons is None else FFNTables.from_linear(blk.up, blk.down, dtype=self.dtype, int8=int8_rows, neurons=neurons))
                single_predictors.append(pred.restricted(neurons).to(self.device, self.dtype))
                single_k.append(k)
        self.bank = AdapterBank(adapters or {}, n_layers=cfg.n_layers, d_model=cfg.d_model, d_ff=cfg.d_ff, dtype=self.dtype)
        for layer in self.bank.layers:
            for key in layer:
                layer[key] = layer[key].to(self.device)
        self._tok_emb = self.model.tok_emb.weight
        self._pos_emb = self.model.pos_emb.weight
        self._single: SingleDecode | None = None
        # the one-token path runs QKV and out in float: take it unless int8 would run them
        one_token_int8 = bool(self._int8) and any(use_int8(name, 1, self.int8_min_tokens) for name in ("qkv", "out"))
        if few_kernel and not one_token_int8 and all(t.up_aug is not None for t in single_tables):
            self._single = SingleDecode(
                self.model,
                int8_ffn=[(self._int8_one_token(j, "up"), self._int8_one_token(j, "down")) for j in range(cfg.n_layers)],
                tables=single_tables,
                predictors=single_predictors,
                ks=single_k,
                n_shards=runtime.kv_shards,
            )

    # ------------------------------------------------------------------ caches
    def new_pool(self, slots: int) -> KVPool:
        c = self.cfg
        return KVPool(n_layers=c.n_layers, slots=slots, n_heads=c.n_heads, max_len=c.max_len, head_dim=c.head_dim, dtype=self.dtype, device=self.device)

    def adapter_row(self, name: str | None) -> int:
        return self.bank.index(name)

    # ------------------------------------------------------------------ steps
    @torch.inference_mode()
    def prefill(self, ids: list[int], *, pool: KVPool, slot: int, adapter: int = 0) -> torch.Tensor:
        """Runs the prompt, fills the slot's cache, returns next-token logits [V] (float32)."""
        t = len(ids)
        if t >= self.cfg.max_len:
            raise ValueError(f"prompt: {t} tokens leave no room to generate (max_len {self.cfg.max_len})")
        tok = torch.tensor([ids], device=self.device)
        x = (self._tok_emb.index_select(0, tok[0]) + self._pos_emb[:t]).unsqueeze(0)
        causal = torch.ones(t, t, dtype=torch.bool, device=self.device).tril()[None, None]
        rows = torch.tensor([adapter], device=self.device) if adapter else None
        for j in range(self.cfg.n_layers):
            x = self._layer(j, x, pool=pool, slots=slice(slot, slot + 1), write_pos=None, tk=t, mask=causal, rows=rows)
        return self._logits(x[:, -1])[0]

    @torch.inference_mode()
    def prefill_batch(self, prompts: list[list[int]], *, pool: KVPool, slots: list[int], adapters: list[int]) -> torch.Tensor:
        """Several prompts in one right-padded forward; next-token logits [m, V] (float32).

        Causal attention means a padded tail never reaches a row's real positions, and the
        cache slots past a row's length are masked off by decode, so this equals m prefills.
        """
        lengths = [len(p) for p in prompts]
        t = max(lengths)
        if t >= self.cfg.max_len:
            raise ValueError(f"prompt: {t} tokens leave no room to generate (max_len {self.cfg.max_len})")
        m = len(prompts)
        tok = torch.zeros(m, t, dtype=torch.long)
        for i, p in enumerate(prompts):
            tok[i, : len(p)] = torch.tensor(p)
        tok = tok.to(self.device)
        x = self._tok_emb[tok] + self._pos_emb[:t]
        causal = torch.ones(t, t, dtype=torch.bool, device=self.device).tril()[None, None]
        rows = torch.tensor(adapters, device=self.device) if any(adapters) else None
        slot_index = torch.tensor(slots, device=self.device)
        for j in range(self.cfg.n_layers):
            x = self._layer(j, x, pool=pool, slots=slot_index, write_pos=None, tk=t, mask=causal, rows=rows)
        last = torch.tensor([n - 1 for n in lengths], device=self.device)
        return self._logits(x[torch.arange(m, device=self.device), last])

    @torch.inference_mode()
    def decode(self, tokens: list[int], *, pool: KVPool, slots: list[int], lengths: list[int], adapters: list[int]) -> torch.Tensor:
        """One decode step for b sequences: token i goes at position lengths[i]. Logits [b, V]."""
        b = len(tokens)
        tk = max(lengths) + 1
        if tk > self.cfg.max_len:
            raise ValueError(f"sequence reached the model's max_len {self.cfg.max_len}")
        if self._single is not None and not any(adapters):
            if b == 1:
                return self._single.step(tokens[0], lengths[0], k_cache=pool.k, v_cache=pool.v, slot=slots[0])
            # a few sequences in float: the same few-kernel layer, batched (int8 keeps the
            # general path, which picks its kernels by token count)
            if not self._int8 and (not self.tables or b <= GATHER_MAX_TOKENS):
                return self._single.step_many(tokens, lengths, k_cache=pool.k, v_cache=pool.v, slots=slots)
        tok = torch.tensor(tokens, device=self.device)
        pos = torch.tensor(lengths, device=self.device)
        x = (self._tok_emb.index_select(0, tok) + self._pos_emb.index_select(0, pos)).unsqueeze(1)  # [b, 1, d]
        contiguous = slots == list(range(slots[0], slots[0] + b))
        slot_index = slice(slots[0], slots[0] + b) if contiguous else torch.tensor(slots, device=self.device)
        mask = None
        write_pos: torch.Tensor | int = pos
        if min(lengths) != max(lengths):
            mask = (torch.arange(tk, device=self.device)[None, :] <= pos[:, None])[:, None, None, :]
        elif contiguous:
            write_pos = lengths[0]  # one position for all: a slice copy instead of an index_put
        rows = torch.tensor(adapters, device=self.device) if any(adapters) else None
        for j in range(self.cfg.n_layers):
            x = self._layer(j, x, pool=pool, slots=slot_index, write_pos=write_pos, tk=tk, mask=mask, rows=rows)
        return self._logits(x[:, 0])

    @torch.inference_mode()
    def forward_chunks(
        self, chunks: list[list[int]], *, pool: KVPool, slots: list[int], starts: list[int], adapters: list[int], n_decode: int = 0
    ) -> torch.Tensor:
        """One forward over ragged chunks (chunked prefill and decode in the same step).

        Sequence i appends ``chunks[i]`` at positions ``starts[i]..`` to its cache slot, which
        already holds its positions below ``starts[i]``; the first ``n_decode`` chunks are
        one-token decode steps (they take the sparse FFN when it is on; prompt chunks take
        the dense one, as :meth:`prefill` does). Per-token work (projections, FFN) runs on
        all tokens flattened into one GEMM with no padding; only attention is per sequence.
        Returns next-token logits after each chunk's last token [n, V] (float32); a prompt
        run in several chunks gives the same logits and cache as one :meth:`prefill`.
        """
        lens = [len(c) for c in chunks]
        if not chunks or min(lens) < 1:
            raise ValueError("forward_chunks: every chunk needs at least one token")
        if any(lens[i] != 1 for i in range(n_decode)):
            raise ValueError("forward_chunks: decode chunks are one token each")
        if len(chunks) == 1 and starts[0] == 0 and n_decode == 0:  # one whole prompt: the leaner prefill path
            return self.prefill(chunks[0], pool=pool, slot=slots[0], adapter=adapters[0]).unsqueeze(0)
        ends = [s + n for s, n in zip(starts, lens)]
        if max(ends) > self.cfg.max_len:
            raise ValueError(f"prompt: {max(ends)} tokens leave no room to generate (max_len {self.cfg.max_len})")
        dev = self.device
        n, t_max, tk = len(chunks), max(lens), max(ends)
        seq_of = [i for i, m in enumerate(lens) for _ in range(m)]
        offset = [j for m in lens for j in range(m)]
        pos_l = [starts[i] + j for i, j in zip(seq_of, offset)]
        tok = torch.tensor([t for c in chunks for t in c], device=dev)
        pos = torch.tensor(pos_l, device=dev)
        x = (self._tok_emb.index_select(0, tok) + self._pos_emb.index_select(0, pos)).unsqueeze(1)  # [N, 1, d]
        layout = _Ragged(
            seq=torch.tensor(seq_of, device=dev),
            offset=torch.tensor(offset, device=dev),
            slot_tok=torch.tensor([slots[i] for i in seq_of], device=dev),
            pos=pos,
            slots=torch.tensor(slots, device=dev),
            n=n,
            t_max=t_max,
            tk=tk,
            # query j of sequence i sees keys 0..starts[i]+j (its cache and its own chunk so far)
            mask=(torch.arange(tk, device=dev)[None, None, :] <= (torch.tensor(starts, device=dev)[:, None, None] + torch.arange(t_max, device=dev)[None, :, None]))[:, None],
            n_decode_tokens=n_decode,
        )
        rows = torch.tensor([adapters[i] for i in seq_of], device=dev) if any(adapters) else None
        for j in range(self.cfg.n_layers):
            x = self._ragged_layer(j, x, pool=pool, lay=layout, rows=rows)
        # each chunk's last token in the flat order
        last = torch.tensor([sum(lens[: i + 1]) - 1 for i in range(n)], device=dev)
        return self._logits(x[last, 0])

    # ------------------------------------------------------------------ internals
    def _logits(self, h: torch.Tensor) -> torch.Tensor:
        return F.linear(self.model.ln_f(h), self._tok_emb).float()

    def _int8_one_token(self, j: int, name: str):
        """The dynamic-int8 projection where it beats float at one token, else None."""
        q = self._int8.get((j, name))
        return q if q is not None and use_int8(name, 1, self.int8_min_tokens) else None

    def _lin(self, j: int, name: str, x: torch.Tensor) -> torch.Tensor:
        q = self._int8.get((j, name))
        if q is not None and use_int8(name, x.shape[0] * x.shape[1], self.int8_min_tokens):
            return q(x)
        return getattr(self.model.blocks[j], name)(x)

    def _layer(self, j: int, x: torch.Tensor, *, pool: KVPool, slots, write_pos, tk: int, mask, rows) -> torch.Tensor:
        blk = self.model.blocks[j]
        c = self.cfg
        lora: LoRAWeights | None = self.bank.weights(j, rows) if rows is not None else None
        b, t, d = x.shape
        qkv = self._proj(j, "qkv", blk.ln1(x), lora)
        q, k, v = qkv.view(b, t, 3, c.n_heads, c.head_dim).permute(2, 0, 3, 1, 4)
        if isinstance(slots, slice):
            k_cache, v_cache = pool.k[j][slots], pool.v[j][slots]  # views: writes land in the pool
        else:
            k_cache, v_cache = pool.k[j], pool.v[j]
        if write_pos is None:  # prefill: positions 0..t-1
            if isinstance(slots, slice):
                k_cache[:, :, :t] = k
                v_cache[:, :, :t] = v
            else:
                k_cache[slots, :, :t] = k
                v_cache[slots, :, :t] = v
            keys, values = k, v
        elif isinstance(write_pos, int):
            k_cache[:, :, write_pos] = k[:, :, 0]
            v_cache[:, :, write_pos] = v[:, :, 0]
            keys, values = k_cache[:, :, :tk], v_cache[:, :, :tk]
        else:
            rows_b = torch.arange(b, device=x.device) if isinstance(slots, slice) else slots
            k_cache[rows_b, :, write_pos] = k[:, :, 0]
            v_cache[rows_b, :, write_pos] = v[:, :, 0]
            if isinstance(slots, slice):
                keys, values = k_cache[:, :, :tk], v_cache[:, :, :tk]
            else:
                keys, values = k_cache[slots, :, :tk], v_cache[slots, :, :tk]
        att = sharded_attention(q, keys, values, mask=mask, n_shards=self.runtime.kv_shards)
        att = att.transpose(1, 2).reshape(b, t, d)
        x = x + self._lin(j, "out", att)
        if lora is not None:
            x = x + lora.delta("out", att)
        h = blk.ln2(x)
        # Sparse FFN serves decode steps; a prompt's many tokens go through the dense GEMM,
        # which is efficient there (selection would only add the predictor and a mask) and
        # keeps the first answer token exact (Deja Vu-style: sparsity where decode is
        # bound by per-token weight traffic).
        if self.runtime.sparse_ffn_k is not None and write_pos is not None:
            ffn = sparse_ffn(
                h, tables=self.tables[j], predictor=self.predictors[j], k=self.runtime.sparse_ffn_k, lora=lora,
                up=lambda v: self._lin(j, "up", v), down=lambda v: self._lin(j, "down", v),
                base=self.base_calibration[j], base_tokens=None if rows is None else rows == 0,
            )
            return x + ffn
        return x + self._dense_ffn(j, h, lora)

    def _ragged_layer(self, j: int, x: torch.Tensor, *, pool: KVPool, lay: _Ragged, rows) -> torch.Tensor:
        """`_layer` over flat tokens x [N, 1, d]: projections per token, attention per sequence."""
        blk = self.model.blocks[j]
        c = self.cfg
        lora: LoRAWeights | None = self.bank.weights(j, rows) if rows is not None else None
        n_tok, _, d = x.shape
        qkv = self._proj(j, "qkv", blk.ln1(x), lora)
        q, k, v = qkv.view(n_tok, 3, c.n_heads, c.head_dim).unbind(1)  # [N, H, D] each
        pool.k[j][lay.slot_tok, :, lay.pos] = k
        pool.v[j][lay.slot_tok, :, lay.pos] = v
        q_pad = q.new_zeros(lay.n, lay.t_max, c.n_heads, c.head_dim)
        q_pad[lay.seq, lay.offset] = q
        keys, values = pool.k[j][lay.slots, :, : lay.tk], pool.v[j][lay.slots, :, : lay.tk]
        att = sharded_attention(q_pad.transpose(1, 2), keys, values, mask=lay.mask, n_shards=self.runtime.kv_shards)
        att = att.transpose(1, 2)[lay.seq, lay.offset].reshape(n_tok, 1, d)
        x = x + self._lin(j, "out", att)
        if lora is not None:
            x = x + lora.delta("out", att)
        h = blk.ln2(x)
        nd = lay.n_decode_tokens
        if self.runtime.sparse_ffn_k is not None and nd:
            # decode tokens take the sparse FFN, prompt tokens the dense one (as in `_layer`)
            dec_lora = _rows(lora, slice(0, nd))
            ffn_dec = sparse_ffn(
                h[:nd], tables=self.tables[j], predictor=self.predictors[j], k=self.runtime.sparse_ffn_k, lora=dec_lora,
                up=lambda v: self._lin(j, "up", v), down=lambda v: self._lin(j, "down", v),
                base=self.base_calibration[j], base_tokens=None if rows is None else rows[:nd] == 0,
            )
            if nd == n_tok:
                return x + ffn_dec
            ffn_rest = self._dense_ffn(j, h[nd:], _rows(lora, slice(nd, None)))
            return x + torch.cat([ffn_dec, ffn_rest])
        return x + self._dense_ffn(j, h, lora)

    def _proj(self, j: int, name: str, h: torch.Tensor, lora: LoRAWeights | None) -> torch.Tensor:
        """Projection ``name`` of block ``j``, plus the rows' LoRA delta where they have one."""
        y = self._lin(j, name, h)
        return y if lora is None else y + lora.delta(name, h)

    def _dense_ffn(self, j: int, h: torch.Tensor, lora: LoRAWeights | None) -> torch.Tensor:
        return self._proj(j, "down", F.relu(self._proj(j, "up", h, lora)), lora)


def _rows(lora: LoRAWeights | None, sel: slice) -> LoRAWeights | None:
    """The per-token LoRA factors of a slice of the flat tokens."""
    if lora is None:
        return None
    return LoRAWeights(a={t: w[sel] for t, w in lora.a.items()}, b={t: w[sel] for t, w in lora.b.items()}, scale=lora.scale)


@dataclass(frozen=True)
class _Ragged:
    """Where each flat token sits: its sequence, offset in the chunk, cache slot and position."""

    seq: torch.Tensor
    offset: torch.Tensor
    slot_tok: torch.Tensor
    pos: torch.Tensor
    slots: torch.Tensor
    n: int
    t_max: int
    tk: int
    mask: torch.Tensor
    n_decode_tokens: int
