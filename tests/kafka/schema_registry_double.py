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

With ``user_info`` set, every request needs that HTTP basic auth, else 401. With ``tls``
(``make_tls``'s files) it serves HTTPS, and asks for a client certificate its CA signed.
"""

import base64
import datetime as dt
import ipaddress
import json
import re
import ssl
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


@dataclass(frozen=True)
class TlsFiles:
    ca: Path  # the CA certificate both sides trust
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def _issue(name: str, issuer: tuple | None, folder: Path, ca: bool = False) -> tuple:
    """A key and certificate for ``name`` (127.0.0.1 as its address), signed by ``issuer``
    ((certificate, key); None: self-signed), written as PEM files."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = dt.datetime.now(dt.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer[0].subject if issuer else subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if not ca:
        address = x509.IPAddress(ipaddress.ip_address("127.0.0.1"))
        builder = builder.add_extension(x509.SubjectAlternativeName([address]), critical=False)
    cert = builder.sign(issuer[1] if issuer else key, hashes.SHA256())
    (folder / f"{name}.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (folder / f"{name}.key").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert, key


def make_tls(folder: Path) -> TlsFiles:
    """A throwaway CA, and a server and a client certificate it signed."""
    ca = _issue("ca", None, folder, ca=True)
    _issue("server", ca, folder)
    _issue("client", ca, folder)
    return TlsFiles(folder / "ca.pem", folder / "server.pem", folder / "server.key",
                    folder / "client.pem", folder / "client.key")  # fmt: skip


class SchemaRegistryDouble:
    def __init__(self, user_info: str | None = None, tls: TlsFiles | None = None):
        self.user_info = user_info
        self.tls = tls
        self.schemas: list[str] = []  # id - 1 -> schema text
        self.subjects: dict[str, list[int]] = {}  # subject -> ids by version
        self.requests: list[str] = []  # "GET /schemas/ids/1", ...
        self.port = 0
        self._server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    def __enter__(self) -> "SchemaRegistryDouble":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        """Serve (again, after ``stop``: on the same port, with the same schemas)."""
        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), self._handler())
        self.port = self._server.server_address[1]
        if self.tls:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(self.tls.server_cert, self.tls.server_key)
            context.load_verify_locations(self.tls.ca)
            context.verify_mode = ssl.CERT_REQUIRED  # mutual TLS: the client shows its own
            self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        """An outage: the port refuses connections until ``start``."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

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
