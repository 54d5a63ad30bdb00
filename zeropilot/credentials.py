"""Where the CLI finds the API address and token: environment first, then a credentials file.

``zeropilot up`` writes the first admin's token to the file (mode 0600) so that the CLI on the
same machine works at once; ``ZEROPILOT_URL`` and ``ZEROPILOT_TOKEN`` override it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from zeropilot.client import DEFAULT_URL


def credentials_file() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "zeropilot" / "credentials.json"


def resolve() -> tuple[str, str | None]:
    saved: dict[str, str] = {}
    path = credentials_file()
    if path.is_file():
        saved = json.loads(path.read_text())
    url = os.environ.get("ZEROPILOT_URL") or saved.get("url") or DEFAULT_URL
    token = os.environ.get("ZEROPILOT_TOKEN") or saved.get("token")
    return url, token


def save(url: str, token: str) -> Path:
    path = credentials_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        json.dump({"url": url, "token": token}, handle)
    return path
