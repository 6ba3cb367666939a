"""Test certificates (imported as `certs`): a CA and leaf certificates it signs, written as PEM files,
made with the `cryptography` package the way an operator's CA (or the chart's genCA) would."""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from zipkv.controlplane.grpc_auth import TlsFiles


@dataclass(frozen=True)
class Ca:
    key: ec.EllipticCurvePrivateKey
    cert: x509.Certificate
    path: Path


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _valid(builder: x509.CertificateBuilder) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return builder.not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(
        now + datetime.timedelta(days=1)
    )


def make_ca(folder: Path, name: str = "zipkv-test-ca") -> Ca:
    key = ec.generate_private_key(ec.SECP256R1())
    builder = _valid(x509.CertificateBuilder()).subject_name(_name(name)).issuer_name(_name(name))
    builder = builder.public_key(key.public_key()).serial_number(x509.random_serial_number())
    builder = builder.add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
    cert = builder.sign(key, hashes.SHA256())
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.crt"
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return Ca(key, cert, path)


def issue(ca: Ca, cn: str, folder: Path, peer_name: str = "") -> TlsFiles:
    """A certificate for `cn` (also its DNS name) signed by `ca`, usable as server and client."""
    key = ec.generate_private_key(ec.SECP256R1())
    builder = _valid(x509.CertificateBuilder()).subject_name(_name(cn)).issuer_name(ca.cert.subject)
    builder = builder.public_key(key.public_key()).serial_number(x509.random_serial_number())
    builder = builder.add_extension(x509.SubjectAlternativeName([x509.DNSName(cn)]), critical=False)
    usage = [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
    builder = builder.add_extension(x509.ExtendedKeyUsage(usage), critical=False)
    cert = builder.sign(ca.key, hashes.SHA256())
    cert_path, key_path = (
        folder / f"{cn}.{ca.cert.serial_number}.crt",
        folder / f"{cn}.{ca.cert.serial_number}.key",
    )
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return TlsFiles(str(cert_path), str(key_path), str(ca.path), peer_name)
