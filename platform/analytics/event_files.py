"""Event files for offline analysis: Parquet or JSON Lines → an Arrow table, and a frame of
events → a file (file I/O only; the analysis itself is the pure
:mod:`ablab.platform.stats.offline`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa

from ablab.platform.stats.offline import ID_COLUMNS, to_table, wanted

if TYPE_CHECKING:
    import pandas as pd


def write_events(events: pd.DataFrame, path: str | Path) -> Path:
    """Parquet for ``.parquet``/``.pq``, JSON Lines otherwise (ISO times in ms)."""
    path = Path(path)
    if path.suffix.lower() in (".parquet", ".pq"):
        events.to_parquet(path, index=False)
    else:
        events.to_json(path, orient="records", lines=True, date_format="iso", date_unit="ms")
    return path


def read_events(path: str | Path) -> pa.Table:
    """Parquet (``.parquet``/``.pq``) or JSON Lines (anything else) as an Arrow table."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"EVENTS: {path} does not exist")
    if path.suffix.lower() in (".parquet", ".pq"):
        import pyarrow.parquet as pq

        schema = pq.read_schema(path)
        names = set(schema.names)
        # ids decoded straight to dictionary arrays: no million Python-visible strings, and
        # _encode skips a second hashing pass (0.5 s of the 1 M-row run)
        ids = [c for c in ID_COLUMNS if c in names and pa.types.is_string(schema.field(c).type)]
        return pq.read_table(path, columns=[c for c in schema.names if wanted(c)], read_dictionary=ids)
    import pyarrow.json as pj

    try:
        return pj.read_json(path)
    except pa.ArrowInvalid:  # mixed-type columns defeat Arrow's inference; pandas is lenient
        import pandas as pd

        return to_table(pd.read_json(path, lines=True, dtype=False))
