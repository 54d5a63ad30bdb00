"""What every CLI command shares: the consoles, failing with an exit code, reading spec files,
and calling the API with its errors turned into messages."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape

from service.core.spec_text import MAX_DOCUMENT_BYTES, DocumentRefused, load_document
from zeropilot import credentials
from zeropilot.client import ApiError, Client, format_detail
from zeropilot.transport import InvalidRequest, TlsRefused, TransportError

# soft_wrap: long lines stay whole when piped or logged, instead of breaking at 80 columns.
console = Console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)

JsonOpt = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")]


def fail(message: str, code: int = 1) -> NoReturn:
    """Print the reason and exit: 1 for a failure, 2 for bad input."""
    err.print(f"[red]error:[/red] {escape(message)}", highlight=False)  # paths may hold "[x]"
    raise typer.Exit(code)


def print_json(payload: Any) -> None:
    sys.stdout.write(json.dumps(payload, indent=2, sort_keys=True) + "\n")


MAX_FILE_BYTES = MAX_DOCUMENT_BYTES  # the API refuses the same documents (service.core.spec_text)


def read_mapping(path: Path, what: str, field: str = "") -> dict[str, Any]:
    """A YAML or JSON file holding a mapping (``.json``: JSON only), or exit 2 naming the
    problem, and ``field``, the spec field that named the file, if one did."""
    where = f"{field}: " if field else ""
    text = _read_text(path, where, what)
    try:
        data = load_document(text, "json" if path.suffix.lower() == ".json" else "yaml")
    except DocumentRefused as exc:
        fail(f"{where}{path} {exc}", 2)
    if not isinstance(data, dict):
        fail(f"{where}{path} must hold a mapping ({what}), not {type(data).__name__}", 2)
    return data


def inline_hf_config(spec: dict[str, Any], base: Path, config: Path | None = None) -> None:
    """Put a config.json's content where the spec names it (``model.hf_config`` as a path,
    relative to the spec's folder) or where ``--hf-config`` gives it; exit 2 naming the field."""
    model = spec.get("model")
    if config is not None:
        kept = {k: model[k] for k in ("attention",) if isinstance(model, dict) and k in model}
        spec["model"] = model = {**kept, "hf_config": str(config.resolve())}
    if not isinstance(model, dict) or not isinstance(model.get("hf_config"), str):
        return
    path = Path(model["hf_config"])
    path = path if path.is_absolute() else base / path
    model["hf_config"] = read_mapping(path, "a Hugging Face config", field="model.hf_config")


def _read_text(path: Path, where: str, what: str) -> str:
    """The file's text, refused unread beyond MAX_FILE_BYTES (a pipe or device included)."""
    try:
        with path.open("rb") as file:
            raw = file.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        fail(f"{where}cannot read {path}: {exc.strerror}", 2)
    if len(raw) > MAX_FILE_BYTES:
        fail(f"{where}{path} is over 1 MiB ({MAX_FILE_BYTES:,} bytes), the limit for {what}", 2)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        fail(f"{where}{path} is not UTF-8 text: {exc.reason} at byte {exc.start}", 2)


def api_client() -> Client:
    url, token = credentials.resolve()
    try:
        return Client(url, token)
    except ValueError as exc:  # a URL or a proxy setting it cannot use
        fail(str(exc), 2)


def call_api(call: Any, *args: Any, **kwargs: Any) -> Any:
    """Call the API; map its errors to a message and an exit code (2 for bad input)."""
    try:
        return call(*args, **kwargs)
    except ApiError as exc:
        code = 2 if exc.status_code == 422 else 1
        fail(f"{exc.status_code}: {format_detail(exc.detail)}", code)
    except InvalidRequest as exc:
        fail(f"cannot send this request: {exc}", 2)
    except TlsRefused as exc:
        fail(f"cannot reach zeropilot at {credentials.resolve()[0]} securely ({exc})")
    except TransportError as exc:
        url = credentials.resolve()[0]
        fail(f"cannot reach zeropilot at {url} ({exc}); is `zeropilot up` running?")
