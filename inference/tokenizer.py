"""Character-level tokenizer whose vocabulary ships in the package (``assets/tokenizer.json``).

Every task in :mod:`ablab.inference.tasks` is written in this alphabet, so nothing is
downloaded at run time and encoding is a table lookup.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

ASSETS = Path(__file__).with_name("assets")
TOKENIZER_FILE = ASSETS / "tokenizer.json"

PAD, BOS, EOS = "<pad>", "<bos>", "<eos>"
SPECIALS = (PAD, BOS, EOS)
# Digits, lowercase letters and the punctuation the task formats use.
ALPHABET = "0123456789abcdefghijklmnopqrstuvwxyz+-=?:;,|#>.[]_ "


@dataclass(frozen=True)
class Tokenizer:
    tokens: tuple[str, ...]

    @property
    def vocab_size(self) -> int:
        return len(self.tokens)

    @property
    def pad_id(self) -> int:
        return self.tokens.index(PAD)

    @property
    def bos_id(self) -> int:
        return self.tokens.index(BOS)

    @property
    def eos_id(self) -> int:
        return self.tokens.index(EOS)

    @property
    def _index(self) -> dict[str, int]:
        return {tok: i for i, tok in enumerate(self.tokens)}

    def encode(self, text: str, *, bos: bool = True) -> list[int]:
        index = _index_of(self.tokens)
        unknown = sorted({ch for ch in text if ch not in index})
        if unknown:
            raise ValueError(f"prompt: characters {unknown!r} are not in the tokenizer's alphabet {ALPHABET!r}")
        ids = [index[ch] for ch in text]
        return [self.bos_id, *ids] if bos else ids

    def decode(self, ids: list[int]) -> str:
        out = []
        for i in ids:
            tok = self.tokens[i]
            if tok == EOS:
                break
            if tok not in SPECIALS:
                out.append(tok)
        return "".join(out)

    def to_json(self) -> str:
        return json.dumps({"type": "char", "tokens": list(self.tokens)}, indent=1)


@lru_cache(maxsize=8)
def _index_of(tokens: tuple[str, ...]) -> dict[str, int]:
    return {tok: i for i, tok in enumerate(tokens)}


def build_tokenizer() -> Tokenizer:
    return Tokenizer(tokens=(*SPECIALS, *ALPHABET))


@lru_cache(maxsize=1)
def load_tokenizer(path: Path = TOKENIZER_FILE) -> Tokenizer:
    """The shipped tokenizer; falls back to building it when the file is absent (first train)."""
    if not path.is_file():
        return build_tokenizer()
    data = json.loads(path.read_text())
    if data.get("type") != "char":
        raise ValueError(f"{path}: tokenizer type {data.get('type')!r} is not 'char'")
    return Tokenizer(tokens=tuple(data["tokens"]))
