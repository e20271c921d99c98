"""A minimal OTLP/HTTP trace receiver for the tests: `python tests/otlp_collector.py PORT FILE`.

It accepts `POST /v1/traces` (protobuf, as the OpenTelemetry SDK's exporter sends it), and
appends one JSON line per span to FILE: ids in hex, name, kind, attributes, the service name.
"""

from __future__ import annotations

import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from google.protobuf.json_format import MessageToDict
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)


def _value(v: dict[str, Any]) -> Any:
    if "arrayValue" in v:
        return [_value(x) for x in v["arrayValue"].get("values", [])]
    for kind in ("stringValue", "boolValue", "doubleValue"):
        if kind in v:
            return v[kind]
    if "intValue" in v:
        return int(v["intValue"])
    return None


def spans_of(request: ExportTraceServiceRequest) -> list[dict[str, Any]]:
    out = []
    for rs in request.resource_spans:
        resource = {a.key: a.value.string_value for a in rs.resource.attributes}
        for ss in rs.scope_spans:
            for span in ss.spans:
                attrs = {a["key"]: _value(a["value"])
                         for a in MessageToDict(span).get("attributes", [])}
                out.append({
                    "trace_id": span.trace_id.hex(), "span_id": span.span_id.hex(),
                    "parent_span_id": span.parent_span_id.hex(), "name": span.name,
                    "kind": span.kind, "attributes": attrs,
                    "service": resource.get("service.name"),
                })
    return out


def main() -> None:
    port, path = int(sys.argv[1]), sys.argv[2]

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            if self.path != "/v1/traces":
                self.send_response(404)
                self.end_headers()
                return
            request = ExportTraceServiceRequest()
            request.ParseFromString(body)
            with open(path, "a") as f:
                for span in spans_of(request):
                    f.write(json.dumps(span) + "\n")
            answer = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def do_GET(self) -> None:
            self.send_response(200)  # readiness probe
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()


if __name__ == "__main__":
    main()
