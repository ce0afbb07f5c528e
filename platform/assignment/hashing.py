"""MurmurHash3 (x86, 32-bit, seed 0) of ``"{salt}:{unit_id}"`` into a bucket space.

MurmurHash3 is fast, well known and has published test vectors, so other SDKs (any
language) can reproduce ablab's buckets exactly. The scalar path uses the C
implementation in ``mmh3``; the batch path is the same algorithm vectorized over a
numpy byte matrix, and tests hold the two equal on arbitrary Unicode input.
"""

from __future__ import annotations

from collections.abc import Sequence

import mmh3
import numpy as np

_C1 = np.uint32(0xCC9E2D51)
_C2 = np.uint32(0x1B873593)


def murmur3_32(key: str | bytes) -> int:
    return mmh3.hash(key, 0, signed=False)


def bucket(salt: str, unit_id: str, space: int) -> int:
    return mmh3.hash(f"{salt}:{unit_id}", 0, signed=False) % space


def _rotl(x: np.ndarray, r: int) -> np.ndarray:
    return (x << np.uint32(r)) | (x >> np.uint32(32 - r))


def _fmix(h: np.ndarray) -> np.ndarray:
    h ^= h >> np.uint32(16)
    h *= np.uint32(0x85EBCA6B)
    h ^= h >> np.uint32(13)
    h *= np.uint32(0xC2B2AE35)
    h ^= h >> np.uint32(16)
    return h


def murmur3_32_batch(keys: Sequence[bytes]) -> np.ndarray:
    """MurmurHash3_x86_32 of every key, as a uint32 array (equal to :func:`murmur3_32`)."""
    n = len(keys)
    if n == 0:
        return np.zeros(0, dtype=np.uint32)
    lengths = np.fromiter(map(len, keys), dtype=np.int64, count=n)
    width = max(4, int(-(-int(lengths.max()) // 4) * 4))
    # numpy's fixed-width bytes dtype pads with NULs: one C-level copy into a matrix.
    matrix = np.zeros((n, width), dtype=np.uint8)
    raw = np.array(keys, dtype=f"S{width}").view(np.uint8).reshape(n, width)
    matrix[:, : raw.shape[1]] = raw
    blocks = matrix.view("<u4")
    full_blocks = lengths // 4
    h = np.zeros(n, dtype=np.uint32)
    with np.errstate(over="ignore"):
        for j in range(int(full_blocks.max())):
            active = full_blocks > j
            k = blocks[:, j] * _C1
            k = _rotl(k, 15) * _C2
            mixed = _rotl(h ^ k, 13) * np.uint32(5) + np.uint32(0xE6546B64)
            h = np.where(active, mixed, h)
        tail_len = lengths % 4
        start = full_blocks * 4
        rows = np.arange(n)
        k1 = np.zeros(n, dtype=np.uint32)
        for offset in (2, 1, 0):
            present = tail_len > offset
            col = np.minimum(start + offset, width - 1)
            byte = matrix[rows, col].astype(np.uint32)
            k1 ^= np.where(present, byte << np.uint32(8 * offset), np.uint32(0))
        has_tail = tail_len > 0
        k1 = _rotl(k1 * _C1, 15) * _C2
        h = np.where(has_tail, h ^ k1, h)
        h ^= lengths.astype(np.uint32)
        return _fmix(h)


def bucket_batch(salt: str, unit_ids: Sequence[str], space: int) -> np.ndarray:
    prefix = f"{salt}:".encode()
    keys = [prefix + uid.encode() for uid in unit_ids]
    return (murmur3_32_batch(keys) % np.uint32(space)).astype(np.int64)
