"""The local cluster's certificates: one CA signs them all, servers carry every name clients
use, and client certificates carry the identities RBAC knows (CN = user, O = groups)."""

from __future__ import annotations

import ipaddress
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from localkube.components import CLIENTS, kubelet_identity
from localkube.pki import Pki, ensure_pki


def make(directory: Path) -> Pki:
    return ensure_pki(
        directory,
        node_name="node-a",
        node_ip="192.0.2.2",
        service_ip="10.96.0.1",
        clients=[*CLIENTS, kubelet_identity("node-a")],
    )


def load(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def test_every_certificate_is_signed_by_the_ca(tmp_path: Path) -> None:
    pki = make(tmp_path)
    ca = load(pki.ca)
    for cert_path in tmp_path.glob("*.crt"):
        cert = load(cert_path)
        cert.verify_directly_issued_by(ca)
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca


def test_the_api_server_answers_to_every_name_pods_and_clients_use(tmp_path: Path) -> None:
    cert = load(make(tmp_path).cert("apiserver"))
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert set(names.get_values_for_type(x509.DNSName)) >= {
        "localhost",
        "node-a",
        "kubernetes",
        "kubernetes.default.svc.cluster.local",
    }
    assert set(names.get_values_for_type(x509.IPAddress)) >= {
        ipaddress.ip_address("127.0.0.1"),
        ipaddress.ip_address("192.0.2.2"),
        ipaddress.ip_address("10.96.0.1"),
    }
    usages = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert ExtendedKeyUsageOID.SERVER_AUTH in usages


def test_client_certificates_carry_rbac_identities(tmp_path: Path) -> None:
    pki = make(tmp_path)
    admin = load(pki.cert("admin")).subject
    assert admin.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "kubernetes-admin"
    assert [a.value for a in admin.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)] == [
        "system:masters"
    ]
    kubelet = load(pki.cert("kubelet-client")).subject
    assert kubelet.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "system:node:node-a"
    assert [a.value for a in kubelet.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)] == [
        "system:nodes"
    ]
    usages = load(pki.cert("scheduler")).extensions.get_extension_for_class(x509.ExtendedKeyUsage)
    assert list(usages.value) == [ExtendedKeyUsageOID.CLIENT_AUTH]


def test_a_second_run_keeps_what_exists(tmp_path: Path) -> None:
    first = make(tmp_path)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    make(tmp_path)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
    assert first.service_account_key.stat().st_mode & 0o777 == 0o600
    assert isinstance(
        x509.load_pem_x509_certificate(first.ca.read_bytes()).public_key(),
        ec.EllipticCurvePublicKey,
    )
