"""Read the physical columns back out of the Flink job's rendered SQL, so a test can hold the
rendering to the field catalogue (the product renders the lists and never parses them)."""

from __future__ import annotations

import re

_CREATE_TABLE = re.compile(r"CREATE\s+TEMPORARY\s+TABLE\s+`?(\w+)`?\s*\(", re.IGNORECASE)
_CREATE_VIEW = re.compile(r"CREATE\s+TEMPORARY\s+VIEW\s+`?(\w+)`?\s+AS\s+SELECT\s", re.IGNORECASE)


def top_level_split(body: str) -> list[str]:
    """``body`` split at the commas outside brackets."""
    parts, depth, current = [], 0, []
    for ch in body:
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    parts.append("".join(current))
    return [p.strip() for p in parts if p.strip()]


def _strip_comments(sql: str) -> str:
    return "\n".join(line.split("--", 1)[0] for line in sql.splitlines())


def declared_tables(sql: str) -> dict[str, dict[str, str]]:
    """Flink table → its physical columns (name → type) as ``sql`` declares them. Computed
    columns, metadata columns and the watermark are left out: they are not what a record
    carries."""
    sql = _strip_comments(sql)
    tables: dict[str, dict[str, str]] = {}
    for match in _CREATE_TABLE.finditer(sql):
        depth, i = 1, match.end()
        while depth and i < len(sql):
            depth += {"(": 1, ")": -1}.get(sql[i], 0)
            i += 1
        columns: dict[str, str] = {}
        for item in top_level_split(sql[match.end():i - 1]):
            words = item.split()
            if words[0].upper() == "WATERMARK" or len(words) < 2 or words[1].upper() == "AS" or "METADATA" in item.upper():
                continue
            columns[words[0].strip("`")] = " ".join(words[1:])
        tables[match.group(1)] = columns
    return tables


def view_columns(sql: str, view: str) -> list[str]:
    """The output column names of the outermost SELECT of ``view`` (``x AS y`` → y)."""
    sql = _strip_comments(sql)
    for match in _CREATE_VIEW.finditer(sql):
        if match.group(1) != view:
            continue
        depth, i = 0, match.end()
        while i < len(sql):
            if sql[i] in "([":
                depth += 1
            elif sql[i] in ")]":
                depth -= 1
            elif depth == 0 and sql[i:i + 5].upper() == "FROM " and sql[i - 1].isspace():
                break
            i += 1
        names = []
        for item in top_level_split(sql[match.end():i]):
            words = item.split()
            names.append(words[-1].strip("`"))
        return names
    raise KeyError(view)
