"""Validation messages as our validators wrote them, for the API's 422 answers and the CLI."""

from __future__ import annotations

# pydantic puts these before the message of a ValueError or an assert raised in a validator.
PYDANTIC_PREFIXES = ("Value error, ", "Assertion failed, ")


def plain_message(message: str) -> str:
    for prefix in PYDANTIC_PREFIXES:
        if message.startswith(prefix):
            return message[len(prefix) :]
    return message
