"""Where dynamic INT8 is worth running, per projection and call size (measured, not assumed).

Dynamic INT8 (fbgemm) quantizes the activations on every call. On the reference CPU
(2-core AMD EPYC, AVX2, no VNNI/AMX) that fixed cost makes INT8 *slower* than fp32 for a
one-token call, and faster once a call carries enough tokens for the int8 GEMM to win
(see the "INT8 vs fp32 per layer" table of ``benchmarks/bench_inference.py`` and
docs/benchmarks/inference.md). ``precision=int8`` therefore keeps both copies of each
projection and runs the int8 kernel only for calls of at least ``INT8_MIN_TOKENS`` tokens
(rows × positions); below that the fp32 kernel is the faster path.
"""

from __future__ import annotations

# projection → smallest number of tokens per call at which int8 beat fp32, measured at the
# shipped shapes (d_model 128, d_ff 3072; best of 30 interleaved rounds): the FFN
# projections (128x3072, 1.5 MB in fp32 vs 0.4 MB in int8) win from one token on; qkv
# (128x384) only from 32 tokens; out (128x128) lost at every size up to 64 tokens.
NEVER = 1 << 30
INT8_MIN_TOKENS: dict[str, int] = {"qkv": 32, "out": NEVER, "up": 1, "down": 1}
# gathering int8 neuron rows and dequantizing them loses to gathering fp32 rows at
# decode sizes (an extra multiply per gathered row, nothing saved on 128-wide rows)
INT8_SPARSE_GATHER = False


def use_int8(projection: str, tokens: int, table: dict[str, int] | None = None) -> bool:
    return tokens >= (table or INT8_MIN_TOKENS)[projection]
