import subprocess
import sys

from hypothesis import given, settings
from hypothesis import strategies as st

from ablab.platform.assignment.hashing import bucket, bucket_batch, murmur3_32


def test_published_murmur3_vectors() -> None:
    # MurmurHash3_x86_32, seed 0 (SMHasher / Appleby reference values).
    assert murmur3_32(b"") == 0
    assert murmur3_32(b"hello") == 0x248BFA47
    assert murmur3_32(b"Hello, world!") == 0xC0363E43
    assert murmur3_32(b"The quick brown fox jumps over the lazy dog") == 0x2E4FF723


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=20), st.lists(st.text(min_size=1, max_size=30), min_size=1, max_size=30))
def test_batch_buckets_equal_scalar(salt: str, units: list[str]) -> None:
    assert bucket_batch(salt, units, 10_000).tolist() == [bucket(salt, u, 10_000) for u in units]


def test_same_bucket_in_a_fresh_process() -> None:
    units = [f"user-{i}" for i in range(200)]
    here = [bucket("exp-salt", u, 10_000) for u in units]
    code = (
        "from ablab.platform.assignment.hashing import bucket;"
        f"print([bucket('exp-salt', u, 10_000) for u in {units!r}])"
    )
    # PYTHONHASHSEED differs per process; the bucket must not depend on it.
    there = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True, env={"PYTHONHASHSEED": "12345"}
    ).stdout
    assert eval(there) == here
