"""A small OTLP/HTTP profiles receiver for the OTLP sender's test (docs/otlp.md).

No OTLP receiver (OpenTelemetry Collector, Pyroscope, Parca) can be
installed on the test machines, so this one stands in for them: it takes
`POST <prefix>/v1development/profiles`, gunzips the body when
`Content-Encoding: gzip` says so, decodes it with the `opentelemetry-proto`
package's ExportProfilesServiceRequest, and answers as a receiver under
load would, from a script:

1. the first request: 503 with `Retry-After: 1` (the sender must wait at
   least 1 s and send the same body again);
2. the second: 200 with an ExportProfilesServiceResponse whose
   `partial_success` has an error message (the sender logs and counts it);
3. every later one: 200 with an empty ExportProfilesServiceResponse.

Every request it took (2xx) is written decompressed to OUT/request-N.pb,
and OUT/log.json lists every request: its path, status answered, time
(monotonic seconds) and headers. Prints `listening on PORT` once bound.

Usage: receiver.py OUT_DIR [--accept-all]

`--accept-all` answers every request with 200 and keeps nothing (for the
sender benchmark, bench/otlp_sender.sh).
"""

import gzip
import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.profiles.v1development import profiles_service_pb2

OUT = sys.argv[1]
ACCEPT_ALL = "--accept-all" in sys.argv[2:]
LOCK = threading.Lock()
LOG = []


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def answer(self, status, body=b"", headers=()):
        self.send_response(status)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(body)))
        for name, value in headers:
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        length = int(self.headers.get("Content-Length", "0"))
        body = self.rfile.read(length)
        if self.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        request = profiles_service_pb2.ExportProfilesServiceRequest()
        request.ParseFromString(body)
        if ACCEPT_ALL:
            self.answer(200, b"")
            return
        with LOCK:
            n = len(LOG)
            entry = {
                "path": self.path,
                "time": time.monotonic(),
                "headers": {k.lower(): v for k, v in self.headers.items()},
                "profiles": sum(
                    len(sp.profiles)
                    for rp in request.resource_profiles
                    for sp in rp.scope_profiles
                ),
            }
            response = profiles_service_pb2.ExportProfilesServiceResponse()
            if not self.path.endswith("/v1development/profiles"):
                entry["status"] = 404
            elif n == 0:
                entry["status"] = 503
            else:
                entry["status"] = 200
                if n == 1:
                    response.partial_success.error_message = "kept all, but slowly"
                taken = 1 + sum(1 for e in LOG if e["status"] == 200)
                with open(os.path.join(OUT, f"request-{taken}.pb"), "wb") as f:
                    f.write(body)
            LOG.append(entry)
            with open(os.path.join(OUT, "log.json.tmp"), "w") as f:
                json.dump(LOG, f)
            os.replace(os.path.join(OUT, "log.json.tmp"), os.path.join(OUT, "log.json"))
        if entry["status"] == 503:
            self.answer(503, b"busy", [("Retry-After", "1")])
        elif entry["status"] == 404:
            self.answer(404, b"not here")
        else:
            self.answer(200, response.SerializeToString())


server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
print(f"listening on {server.server_address[1]}", flush=True)
server.serve_forever()
