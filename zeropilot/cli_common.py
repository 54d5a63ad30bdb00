"""What every CLI command shares: the consoles, failing with an exit code, reading spec files,
and calling the API with its errors turned into messages."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any, NoReturn

import httpx
import typer
import yaml
from rich.console import Console

from zeropilot import credentials
from zeropilot.client import ApiError, Client, format_detail

# soft_wrap: long lines stay whole when piped or logged, instead of breaking at 80 columns.
console = Console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)

JsonOpt = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")]


def fail(message: str, code: int = 1) -> NoReturn:
    """Print the reason and exit: 1 for a failure, 2 for bad input."""
    err.print(f"[red]error:[/red] {message}", highlight=False)
    raise typer.Exit(code)


def print_json(payload: Any) -> None:
    sys.stdout.write(json.dumps(payload, indent=2, sort_keys=True) + "\n")


def read_mapping(path: Path, what: str) -> dict[str, Any]:
    """A YAML/JSON file holding a mapping, or exit 2 naming what is wrong with it."""
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        fail(f"cannot read {path}: {exc.strerror}", 2)
    except yaml.YAMLError as exc:
        fail(f"{path} is not valid YAML/JSON: {exc}", 2)
    if not isinstance(data, dict):
        fail(f"{path} must hold a mapping ({what}), not {type(data).__name__}", 2)
    return data


def api_client() -> Client:
    url, token = credentials.resolve()
    return Client(url, token)


def call_api(call: Any, *args: Any, **kwargs: Any) -> Any:
    """Call the API; map its errors to a message and an exit code (2 for bad input)."""
    try:
        return call(*args, **kwargs)
    except ApiError as exc:
        code = 2 if exc.status_code == 422 else 1
        fail(f"{exc.status_code}: {format_detail(exc.detail)}", code)
    except httpx.TransportError as exc:
        url = credentials.resolve()[0]
        fail(f"cannot reach zeropilot at {url} ({exc}); is `zeropilot up` running?")
