"""Tokens: user bearer tokens (stored only as hashes) and per-attempt runtime tokens.

A runtime token is an HMAC of the attempt id under the service's secret key, so the worker can
hand it to the training processes and the API can check it without either storing it.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

USER_TOKEN_PREFIX = "zp_"  # noqa: S105 (a prefix, not a secret)
ATTEMPT_TOKEN_PREFIX = "zpa_"  # noqa: S105
MISSING_TOKEN = "missing bearer token (set ZEROPILOT_TOKEN for the CLI)"  # noqa: S105 (words)
UNKNOWN_TOKEN = "unknown or revoked token"  # noqa: S105 (words)


def new_user_token() -> str:
    return USER_TOKEN_PREFIX + secrets.token_urlsafe(32)


def hash_token(token: str) -> str:
    # Tokens are 256-bit random strings, so a plain digest is enough (no dictionary to guess from).
    return hashlib.sha256(token.encode()).hexdigest()


def attempt_token(secret_key: bytes, attempt_id: str) -> str:
    digest = hmac.new(secret_key, f"attempt:{attempt_id}".encode(), hashlib.sha256).hexdigest()
    return ATTEMPT_TOKEN_PREFIX + digest


def attempt_token_valid(secret_key: bytes, attempt_id: str, token: str) -> bool:
    return hmac.compare_digest(attempt_token(secret_key, attempt_id), token)
