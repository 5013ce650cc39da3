"""TLS and mutual TLS on the gRPC port, with certificates made for the test."""

from __future__ import annotations

import datetime
import ipaddress
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from sandboxd import errors
from sandboxd.client import AsyncClient
from tests.unit.conftest import MakeApp

pytestmark = pytest.mark.timeout(30)


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _cert(
    subject: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: x509.Certificate | None,
    issuer_key: ec.EllipticCurvePrivateKey | None,
    *,
    ca: bool = False,
    server: bool = False,
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(issuer.subject if issuer else name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if server:
        builder = builder.add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
    return builder.sign(issuer_key or key, hashes.SHA256())


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("pki")
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = _cert("sandboxd-test-ca", ca_key, None, None, ca=True)
    files: dict[str, Path] = {}
    for who, is_server in [("server", True), ("client", False)]:
        key = ec.generate_private_key(ec.SECP256R1())
        cert = _cert(who, key, ca, ca_key, server=is_server)
        files[f"{who}.crt"] = d / f"{who}.crt"
        files[f"{who}.crt"].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        files[f"{who}.key"] = d / f"{who}.key"
        files[f"{who}.key"].write_bytes(_pem_key(key))
    files["ca.crt"] = d / "ca.crt"
    files["ca.crt"].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    return files


async def test_tls_serves_only_tls(make_app: MakeApp, pki: dict[str, Path]) -> None:
    app = await make_app(
        server__tls_cert_file=str(pki["server.crt"]), server__tls_key_file=str(pki["server.key"])
    )
    async with AsyncClient(app.address, root_certificates=pki["ca.crt"].read_bytes()) as client:
        assert await client.list_pools() == []
    async with AsyncClient(app.address) as plaintext:
        with pytest.raises(errors.SandboxdError):
            await plaintext.list_pools()


async def test_mutual_tls_requires_a_client_certificate(make_app: MakeApp, pki: dict[str, Path]) -> None:
    app = await make_app(
        server__tls_cert_file=str(pki["server.crt"]),
        server__tls_key_file=str(pki["server.key"]),
        server__tls_client_ca_file=str(pki["ca.crt"]),
    )
    ca = pki["ca.crt"].read_bytes()
    pair = (pki["client.crt"].read_bytes(), pki["client.key"].read_bytes())
    async with AsyncClient(app.address, root_certificates=ca, client_certificate=pair) as client:
        await client.create_pool("p", "img", max_size=2)
        assert [p.spec.name for p in await client.list_pools()] == ["p"]
    async with AsyncClient(app.address, root_certificates=ca) as anonymous:
        with pytest.raises(errors.SandboxdError):
            await anonymous.list_pools()


async def test_half_configured_tls_is_refused(make_app: MakeApp, pki: dict[str, Path]) -> None:
    with pytest.raises(ValueError, match="both"):
        await make_app(server__tls_cert_file=str(pki["server.crt"]))
