"""Gateway-scoped caller keys, and whose ``Authorization`` may reach which backend.

A backend with ``api_key_env`` lends the operator's key to every request it serves, so a
gateway with such a backend asks each caller for a gateway key (``load_settings`` refuses
to start without one configured). Keys come from ``ABLAB_GATEWAY_KEYS`` (comma-separated;
hashed as they are read) and/or ``ABLAB_GATEWAY_KEYS_FILE`` (one ``sha256:<hex>`` digest a
line, ``#`` comments: digests only, so the file holds no key). Only SHA-256 digests are kept
in memory and compared, in constant time; a key is never logged or echoed.

A caller sends its key as ``X-Ablab-Key: <key>`` or ``Authorization: Bearer <key>``. A key
sent in ``Authorization`` is the gateway's and is never forwarded; ``X-Ablab-Key`` leaves
``Authorization`` to the caller's backend (see :func:`forwarded_authorization`).
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

from ablab.platform.gateway.settings import Backend, GatewayConfigError

KEYS_ENV = "ABLAB_GATEWAY_KEYS"
KEYS_FILE_ENV = "ABLAB_GATEWAY_KEYS_FILE"
KEY_HEADER = "x-ablab-key"
MIN_KEY_CHARS = 16  # a guessable key guards nothing
_DIGEST_LINE = re.compile(r"^sha256:([0-9a-f]{64})$")


def key_digest(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


def load_key_digests(env: Mapping[str, str]) -> frozenset[str]:
    """The digests of every configured caller key (empty: none configured)."""
    out: set[str] = set()
    if raw := env.get(KEYS_ENV):
        for key in (k.strip() for k in raw.split(",")):
            if not key:
                continue
            if len(key) < MIN_KEY_CHARS:
                raise GatewayConfigError(f"{KEYS_ENV}: each key needs at least {MIN_KEY_CHARS} characters (e.g. "
                                         "`python -c 'import secrets; print(secrets.token_urlsafe(32))'`)")
            out.add(key_digest(key))
    if path := env.get(KEYS_FILE_ENV):
        try:
            lines = Path(path).read_text().splitlines()
        except OSError as exc:
            raise GatewayConfigError(f"{KEYS_FILE_ENV}={path}: {exc.strerror}") from None
        for n, line in enumerate(lines, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            found = _DIGEST_LINE.match(line.lower())
            if found is None:  # the line itself is not echoed: it may be a pasted key
                raise GatewayConfigError(f"{KEYS_FILE_ENV}={path} line {n}: expected `sha256:<64 hex digits>` "
                                         "(`ablab` never stores a caller key itself: write its digest, e.g. "
                                         "`printf %s \"$KEY\" | sha256sum`)")
            out.add(found.group(1))
    return frozenset(out)


def lenders(backends: Iterable[Backend]) -> list[str]:
    """Backends that send the operator's key (``api_key_env``) with every request."""
    return sorted(b.name for b in backends if b.api_key_env)


def presented_key(headers: Mapping[str, str]) -> tuple[str | None, bool]:
    """The caller's gateway key and whether it came in ``Authorization`` (then consumed)."""
    if key := headers.get(KEY_HEADER):
        return key.strip(), False
    scheme, _, token = (headers.get("authorization") or "").partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip(), True
    return None, False


def key_allowed(digests: frozenset[str], key: str | None) -> bool:
    """Whether ``key`` is one of the configured keys. Every digest is compared (in constant
    time each), so the answer's timing does not say which one matched or how far."""
    if key is None:
        return False
    mine = key_digest(key).encode()
    ok = False
    for d in digests:
        ok |= hmac.compare_digest(mine, d.encode())
    return ok


def forwarded_authorization(caller_auth: str | None, *, backend: Backend, named: Backend) -> str | None:
    """The caller's ``Authorization`` as the backend may receive it: only the backend the
    caller's own request names (``named``: by its model or the default, not the backend a
    variant moved it to), and only where that backend forwards caller auth."""
    if caller_auth is None or backend.name != named.name or not backend.forwards_caller_auth:
        return None
    return caller_auth
