"""The API process: uvicorn serving the application with the head and connection limits of
``settings.api`` (``service/api/connection_limits.py``). ``zeropilot up``, the image, compose and
the chart all start the API through here, so none of them runs it without those limits.

    python -m service.api.serve [--host H] [--port P]
"""

from __future__ import annotations

import argparse
from typing import Any

import uvicorn

from service.api.connection_limits import LimitedHttpToolsProtocol, raise_open_file_limit
from service.settings import get_settings

FACTORY = "service.api.app:create_app"


def run_api(app: Any, host: str, port: int, **options: Any) -> None:
    """Serve ``app`` (an application, or with ``factory=True`` an import string of a factory)
    until SIGTERM or Ctrl-C, every connection under the limits."""
    raise_open_file_limit()
    uvicorn.run(app, host=host, port=port, http=LimitedHttpToolsProtocol, **options)


def main(argv: list[str] | None = None) -> None:
    api = get_settings().api
    parser = argparse.ArgumentParser(prog="python -m service.api.serve", description=__doc__)
    parser.add_argument("--host", default=api.host, help=f"address (default {api.host})")
    parser.add_argument("--port", type=int, default=api.port, help=f"port (default {api.port})")
    parser.add_argument("--log-level", default="info", help="uvicorn's log level")
    args = parser.parse_args(argv)
    run_api(FACTORY, args.host, args.port, factory=True, log_level=args.log_level)


if __name__ == "__main__":
    main()
