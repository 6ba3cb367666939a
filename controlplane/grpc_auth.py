"""Credentials on the gRPC hops (router <-> worker), shared by the router and the worker.

Two layers, used together in production:
- mutual TLS (grpcio's SSL credentials): every server asks for a client certificate signed by the
  operator's CA, every client checks the server's. The client certificate's common name is the peer's
  identity; a report may only name worker ids under it (`<identity>` or `<identity>/<replica>`).
- bearer tokens in the `authorization` metadata: the report token (worker -> router) and the dispatch
  token (router -> worker, on Generate and Abort). On loopback without TLS they are the only check.
Tokens are compared as bytes in constant time, so a non-ASCII token is simply wrong, never an error.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

log = logging.getLogger("zipkv.grpc_auth")
PLAINTEXT_WARNING = (
    "gRPC is PLAINTEXT ({what}): tokens and prompts cross the network unencrypted and peers are not "
    "authenticated by certificate. Fine on loopback for local development; in production set mutual TLS "
    "(router: security.tls, worker: ZIPKV_TLS_CERT/ZIPKV_TLS_KEY/ZIPKV_TLS_CA)."
)


@dataclass(frozen=True, slots=True)
class TlsFiles:
    cert_file: str  # this process's certificate chain (PEM)
    key_file: str  # its private key (PEM)
    ca_file: str  # the CA that signed the peers' certificates (PEM)
    peer_name: str = ""  # name the peer's certificate must hold (empty: the address's host)

    def read(self) -> tuple[bytes, bytes, bytes]:
        return tuple(Path(p).read_bytes() for p in (self.cert_file, self.key_file, self.ca_file))  # type: ignore[return-value]


def server_credentials(tls: TlsFiles) -> grpc.ServerCredentials:
    """Server side of mutual TLS: a client without a certificate from `ca_file` cannot connect."""
    cert, key, ca = tls.read()
    return grpc.ssl_server_credentials([(key, cert)], root_certificates=ca, require_client_auth=True)


def channel_options(tls: TlsFiles | None) -> list[tuple[str, Any]]:
    """Peers are dialled by address (pod IPs); the certificate names a service, so check that name."""
    return [("grpc.ssl_target_name_override", tls.peer_name)] if tls and tls.peer_name else []


def open_channel(
    address: str, tls: TlsFiles | None, options: list[tuple[str, Any]] | None = None
) -> grpc.aio.Channel:
    """A grpc.aio channel: mutual TLS when `tls` is given, else plaintext (the caller logged that);
    `options`: further channel options (the router's keepalive, grpc_keepalive.py)."""
    extra = options or []
    if tls is None:
        return grpc.aio.insecure_channel(address, options=extra)
    cert, key, ca = tls.read()
    creds = grpc.ssl_channel_credentials(root_certificates=ca, private_key=key, certificate_chain=cert)
    return grpc.aio.secure_channel(address, creds, options=channel_options(tls) + extra)


# Every gRPC server of ours binds without SO_REUSEPORT, which gRPC turns on by default: with it, a second
# server can bind a port another one holds (port 0 included), the connections split between the two, and a
# call to a stopped or misconfigured server silently reaches another. Without it the bind fails loudly.
EXCLUSIVE_PORT = ("grpc.so_reuseport", 0)


def add_port(server: grpc.aio.Server, address: str, tls: TlsFiles | None) -> int:
    if tls is None:
        return server.add_insecure_port(address)
    return server.add_secure_port(address, server_credentials(tls))


def bearer_token(metadata: Iterable[tuple[str, str | bytes]] | None) -> bytes:
    """The token of an `authorization: Bearer <token>` entry (b"" when there is none)."""
    for key, value in metadata or ():
        if key == "authorization":
            raw = value if isinstance(value, bytes) else value.encode("utf-8", "replace")
            return raw[7:] if raw.startswith(b"Bearer ") else b""
    return b""


def tokens_equal(given: bytes | str, expected: str) -> bool:
    """Constant-time comparison that never raises (non-ASCII input is just unequal)."""
    if not expected:
        return False
    raw = given if isinstance(given, bytes) else given.encode("utf-8", "replace")
    return hmac.compare_digest(raw, expected.encode())


def bearer_metadata(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),) if token else ()


def peer_identity(context: grpc.aio.ServicerContext) -> str | None:
    """The common name of the peer's verified client certificate (None without one)."""
    auth = context.auth_context() or {}
    names = auth.get("x509_common_name") or []
    return names[0].decode() if names else None


def warn_plaintext(what: str) -> None:
    log.warning(PLAINTEXT_WARNING.format(what=what), extra={"grpc_plaintext": what})
