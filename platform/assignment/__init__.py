"""Deterministic assignment of units to experiment variants (pure functions, no I/O)."""

from ablab.platform.assignment.engine import (
    Assignment,
    AssignmentConfig,
    ExperimentSpec,
    HoldoutSpec,
    LayerSpec,
    VariantSpec,
    assign,
    assign_batch,
)
from ablab.platform.assignment.hashing import bucket, bucket_batch, murmur3_32

__all__ = [
    "Assignment",
    "AssignmentConfig",
    "ExperimentSpec",
    "HoldoutSpec",
    "LayerSpec",
    "VariantSpec",
    "assign",
    "assign_batch",
    "bucket",
    "bucket_batch",
    "murmur3_32",
]
