"""A stand-in for `vllm serve` on loopback that answers plain completions after a pause and records the most requests
it held at once in `<log dir>/in-flight.json`: what a test of how many requests a client keeps in flight reads."""

from __future__ import annotations

import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

PAUSE_S = 0.3


def main(argv: list[str]) -> None:
    port = int(argv[argv.index("--port") + 1])
    record = Path(argv[argv.index("--record") + 1]) if "--record" in argv else Path("in-flight.json")
    lock, state = threading.Lock(), {"now": 0, "most": 0, "requests": 0}

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

        def do_GET(self) -> None:
            self._answer({})

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            with lock:
                state["now"] += 1
                state["requests"] += 1
                state["most"] = max(state["most"], state["now"])
            time.sleep(PAUSE_S)
            with lock:
                state["now"] -= 1
                record.write_text(json.dumps(state))
            body = {"choices": [{"token_ids": [5, 6, 7], "text": ""}], "usage": {"completion_tokens": 3}}
            self._answer({**body, "metrics": {"time_to_first_token_ms": 1.0, "generation_time_ms": 2.0}})

        def _answer(self, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()


if __name__ == "__main__":
    main(sys.argv)
