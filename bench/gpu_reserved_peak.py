"""On a GPU, each step's metrics carry torch's reserved peak beside the allocated one.

Plays the API with a small HTTP server that records what arrives, makes the allocator reserve
more than it holds (a large tensor freed, then smaller ones), reports one step through
``zeropilot.runtime.Reporter`` and prints what the server received: ``memory_peak_bytes`` (what
the training passes, max_memory_allocated) and ``extra.memory_reserved_peak_bytes`` (added by
the runtime). Needs CUDA.

    python bench/gpu_reserved_peak.py
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import torch

from zeropilot.runtime import Reporter

received: list[Any] = []


class Handler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        received.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
        self.send_response(204)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *_: Any) -> None: ...


def main() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    reporter = Reporter(url=f"http://127.0.0.1:{server.server_address[1]}", attempt_id="a1",
                        token="t")  # fmt: skip
    big = torch.empty(2 * 1024**3, dtype=torch.uint8, device="cuda")
    del big  # freed, still reserved by the caching allocator
    small = [torch.empty(64 * 1024**2, dtype=torch.uint8, device="cuda") for _ in range(4)]
    allocated = torch.cuda.max_memory_allocated()
    reporter.metrics(1, loss=1.0, tokens_per_s=1000.0, memory_peak_bytes=allocated)
    reporter.flush()
    server.shutdown()
    point = received[0][0]
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}: reported"
          f" memory_peak_bytes {point['memory_peak_bytes']}, extra {json.dumps(point['extra'])};"
          f" torch says reserved peak {torch.cuda.max_memory_reserved()}, {len(small)} tensors"
          " alive")  # fmt: skip


if __name__ == "__main__":
    main()
