"""Small builders shared by the integration and end-to-end tests."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import redis
from sqlmodel import Session

from service.db.session import get_engine
from service.db.users import create_user

REPO = Path(__file__).resolve().parents[2]


def tiny_spec(name: str = "tiny-gpt", steps: int = 20, **changes: Any) -> dict[str, Any]:
    """The example tiny job as a dict, with working_dir resolved like the CLI does."""
    spec: dict[str, Any] = {
        "name": name,
        "entrypoint": "train_tiny.py",
        "working_dir": str(REPO / "examples"),
        "args": ["--steps", str(steps), "--checkpoint-interval", "10"],
        "model": {"hidden_size": 64, "num_layers": 2, "num_heads": 4, "vocab_size": 128},
        "training": {
            "sequence_length": 32,
            "global_batch_size": 8,
            "precision": "fp32",
            "learning_rate": 0.003,
        },
        "resources": {"cluster": "local", "nodes": 1, "gpus_per_node": 2},
    }
    spec.update(changes)
    return spec


def three_users(database_url: str) -> dict[str, str]:
    """Tokens of alice (team vision), bob (team speech) and root (team ops, an admin)."""
    with Session(get_engine(database_url)) as session:
        made = {
            "alice": create_user(session, "alice", "vision"),
            "bob": create_user(session, "bob", "speech"),
            "root": create_user(session, "root", "ops", is_admin=True),
        }
        session.commit()
    return made


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def queued_tasks(redis_url: str) -> list[tuple[str, list[Any]]]:
    """(task name, args) of every message waiting in Celery's default queue in Redis."""
    messages = redis.Redis.from_url(redis_url).lrange("celery", 0, -1)
    result = []
    for raw in reversed(messages):
        message = json.loads(raw)
        args = json.loads(base64.b64decode(message["body"]))[0]
        result.append((message["headers"]["task"], args))
    return result
