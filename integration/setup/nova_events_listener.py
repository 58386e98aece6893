#!/usr/bin/python3
"""A debugging stand-in for Nova's os-server-external-events endpoint.

Listens on 127.0.0.1:PORT, answers every POST .../os-server-external-events the way Nova does
(200, each event echoed with "code": 200) and prints one JSON line per event:
{"t": <unix time>, "name": ..., "server_uuid": ..., "status": ..., "tag": ...}.
Used by integration/setup/neutron-smoke.sh to watch Neutron's notifier; vireo itself serves this
endpoint in the real tests. Stops after --max-seconds (bounded, so it can never linger).
"""

import argparse
import json
import sys
import time
from http.server import BaseHTTPRequestHandler, HTTPServer


class Handler(BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802 (http.server naming)
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if not self.path.rstrip("/").endswith("/os-server-external-events"):
            self.send_error(404)
            return
        try:
            events = json.loads(body)["events"]
        except (ValueError, KeyError, TypeError):
            self.send_error(400)
            return
        now = time.time()
        for ev in events:
            print(json.dumps({"t": round(now, 3), **ev}), flush=True)
        reply = json.dumps({"events": [dict(ev, code=200) for ev in events]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *args):
        pass


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--port", type=int, default=8774)
    p.add_argument("--max-seconds", type=float, default=600)
    args = p.parse_args()
    server = HTTPServer(("127.0.0.1", args.port), Handler)
    server.timeout = 0.5
    print(json.dumps({"listening": args.port}), file=sys.stderr, flush=True)
    deadline = time.monotonic() + args.max_seconds
    while time.monotonic() < deadline:
        server.handle_request()
    return 0


if __name__ == "__main__":
    sys.exit(main())
