"""A test double of a Confluent-compatible schema registry, on loopback.

No registry server installs on our machines from PyPI, Debian or npm (Confluent Schema Registry
and Apicurio ship as JVM services or containers; ``pip download karapace`` finds no
distribution), so the tests talk to this stand-in through confluent-kafka's real
``SchemaRegistryClient`` and ``AvroSerializer``. It serves
the documented subset of the REST API the client's serializer and our reader call
(https://docs.confluent.io/platform/current/schema-registry/develop/api.html):

- ``POST /subjects/{subject}/versions``: register a schema, answer ``{"id": n}`` (the same text
  keeps its id, in any subject);
- ``POST /subjects/{subject}``: look a schema up in a subject;
- ``GET /schemas/ids/{id}``: ``{"schema": text}``, 404 with error code 40403 when unknown;
- ``GET /subjects/{subject}/versions/{version|latest}``: ``{subject, id, version, schema}``;
- ``GET /subjects``.

With ``user_info`` set, every request needs that HTTP basic auth, else 401.
"""

import base64
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class SchemaRegistryDouble:
    def __init__(self, user_info: str | None = None):
        self.user_info = user_info
        self.schemas: list[str] = []  # id - 1 -> schema text
        self.subjects: dict[str, list[int]] = {}  # subject -> ids by version
        self.requests: list[str] = []  # "GET /schemas/ids/1", ...
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> "SchemaRegistryDouble":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def register(self, subject: str, schema: str) -> int:
        if schema not in self.schemas:
            self.schemas.append(schema)
        sid = self.schemas.index(schema) + 1
        versions = self.subjects.setdefault(subject, [])
        if sid not in versions:
            versions.append(sid)
        return sid

    def _answer(self, method: str, path: str, body: dict) -> tuple[int, object]:
        path = path.split("?", 1)[0]
        if m := re.fullmatch(r"/schemas/ids/(\d+)", path):
            sid = int(m[1])
            if method == "GET" and 0 < sid <= len(self.schemas):
                return 200, {"schema": self.schemas[sid - 1]}
            return 404, {"error_code": 40403, "message": "Schema not found"}
        if path == "/subjects" and method == "GET":
            return 200, sorted(self.subjects)
        if m := re.fullmatch(r"/subjects/([^/]+)/versions", path):
            if method == "POST":
                return 200, {"id": self.register(m[1], body["schema"])}
        if m := re.fullmatch(r"/subjects/([^/]+)/versions/(latest|\d+)", path):
            versions = self.subjects.get(m[1], [])
            index = len(versions) if m[2] == "latest" else int(m[2])
            if method == "GET" and 0 < index <= len(versions):
                sid = versions[index - 1]
                return 200, {"subject": m[1], "id": sid, "version": index,
                             "schema": self.schemas[sid - 1]}  # fmt: skip
            return 404, {"error_code": 40401, "message": "Subject or version not found"}
        if m := re.fullmatch(r"/subjects/([^/]+)", path):
            if method == "POST" and body.get("schema") in self.schemas:
                sid = self.schemas.index(body["schema"]) + 1
                versions = self.subjects.get(m[1], [])
                if sid in versions:
                    version = versions.index(sid) + 1
                    return 200, {"subject": m[1], "id": sid, "version": version,
                                 "schema": body["schema"]}  # fmt: skip
            return 404, {"error_code": 40403, "message": "Schema not found"}
        return 404, {"error_code": 404, "message": f"{method} {path} is not served here"}

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        double = self

        class Handler(BaseHTTPRequestHandler):
            def _serve(self, method: str) -> None:
                double.requests.append(f"{method} {self.path}")
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}") if length else {}
                expected = double.user_info
                auth = self.headers.get("Authorization", "")
                if expected and auth != "Basic " + base64.b64encode(expected.encode()).decode():
                    status, answer = 401, {"error_code": 401, "message": "Unauthorized"}
                else:
                    status, answer = double._answer(method, self.path, body)
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/vnd.schemaregistry.v1+json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                self._serve("GET")

            def do_POST(self) -> None:  # noqa: N802
                self._serve("POST")

            def log_message(self, *args: object) -> None:  # quiet
                pass

        return Handler
