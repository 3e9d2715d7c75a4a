"""A service component for the heterogeneous-job tests: an HTTP server on ``--port`` that
answers every GET with its process id, and records that id in ``<run dir>/out/server-<pid>``
when it starts (a test kills it by that id and sees a new one answer after its restart)."""

from __future__ import annotations

import argparse
import os
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = str(os.getpid()).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # one line per step is noise
        pass


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    port = parser.parse_args().port
    server = ThreadingHTTPServer(("0.0.0.0", port), Handler)
    server.allow_reuse_address = True
    out = Path(os.environ["DDLAUNCH_RUN_DIR"]) / "out"
    out.mkdir(exist_ok=True)
    (out / f"server-{os.getpid()}").write_text(f"{os.uname().nodename}:{port}\n")
    print(f"serving on {os.uname().nodename}:{port} as {os.getpid()}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
