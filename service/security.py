"""API tokens: random secrets shown once, stored only as SHA-256 digests, shown by a public id.

Tokens carry 256 bits of randomness, so a plain SHA-256 digest (no salt, no KDF) is enough to make a
leaked database useless to an attacker while keeping lookup a single indexed equality.

No part of a secret is stored or shown: lists, logs and the dashboard name a token by its public id
(`tok_` + 8 random characters), drawn independently of the secret.
"""

from __future__ import annotations

import hashlib
import secrets

TOKEN_PREFIX = "tsrl_"
PUBLIC_ID_PREFIX = "tok_"
PUBLIC_ID_PATTERN = r"^tok_[A-Za-z0-9_-]{8}$"


def new_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def new_public_id() -> str:
    """A token's public name: random, unrelated to its secret (6 random bytes, 8 url-safe chars)."""
    return PUBLIC_ID_PREFIX + secrets.token_urlsafe(6)
