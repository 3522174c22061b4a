"""API tokens: random secrets shown once, stored only as SHA-256 digests.

Tokens carry 256 bits of randomness, so a plain SHA-256 digest (no salt, no KDF) is enough to make a
leaked database useless to an attacker while keeping lookup a single indexed equality.
"""

from __future__ import annotations

import hashlib
import secrets

TOKEN_PREFIX = "tsrl_"


def new_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def display_prefix(token: str) -> str:
    """The first characters of a token, safe to show in lists (like GitHub's token prefixes)."""
    return token[: len(TOKEN_PREFIX) + 4]
