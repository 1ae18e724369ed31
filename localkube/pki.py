"""The local cluster's certificates and keys, as kubeadm lays them out, made with `cryptography`.

One CA signs everything: etcd's serving and client certificates, the API server's serving
certificate (for every name a client or pod may use to reach it), the client certificates of
the components and of the admin, and the kubelet's serving certificate. The service-account
signing key pair is separate. Identities follow Kubernetes' RBAC conventions (CN = user,
O = groups), so the default ClusterRoleBindings apply.

What it owns: writing the files once into a directory. What it must never do: start anything.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from .config import CLUSTER_DOMAIN

__all__ = ["ClientIdentity", "Pki", "ensure_pki"]

VALIDITY = datetime.timedelta(days=3650)
SERVER = ExtendedKeyUsageOID.SERVER_AUTH
CLIENT = ExtendedKeyUsageOID.CLIENT_AUTH


@dataclass(frozen=True)
class ClientIdentity:
    """Who a component is to the API server: user name and groups."""

    file: str
    user: str
    groups: tuple[str, ...] = ()


@dataclass(frozen=True)
class Pki:
    directory: Path

    @property
    def ca(self) -> Path:
        return self.directory / "ca.crt"

    def cert(self, name: str) -> Path:
        return self.directory / f"{name}.crt"

    def key(self, name: str) -> Path:
        return self.directory / f"{name}.key"

    @property
    def service_account_key(self) -> Path:
        return self.directory / "sa.key"

    @property
    def service_account_public_key(self) -> Path:
        return self.directory / "sa.pub"


def ensure_pki(
    directory: Path,
    *,
    node_name: str,
    node_ip: str,
    service_ip: str,
    clients: list[ClientIdentity],
) -> Pki:
    """Create the CA and every certificate that does not exist yet; keep those that do."""
    directory.mkdir(parents=True, exist_ok=True)
    pki = Pki(directory)
    ca_key = _load_or_create_key(pki.key("ca"))
    if not pki.ca.exists():
        _write_cert(pki.ca, _self_signed_ca(ca_key))
    ca_cert = x509.load_pem_x509_certificate(pki.ca.read_bytes())
    signer = _Signer(ca_cert, ca_key)

    loopback = ["localhost", "127.0.0.1"]
    signer.issue(pki, "etcd-server", "etcd", (), [*loopback, node_ip], (SERVER, CLIENT))
    signer.issue(
        pki,
        "apiserver",
        "kube-apiserver",
        (),
        [
            *loopback,
            node_ip,
            service_ip,
            node_name,
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            f"kubernetes.default.svc.{CLUSTER_DOMAIN}",
        ],
        (SERVER,),
    )
    signer.issue(pki, "kubelet-server", node_name, (), [*loopback, node_ip, node_name], (SERVER,))
    for client in clients:
        signer.issue(pki, client.file, client.user, client.groups, [], (CLIENT,))

    if not pki.service_account_key.exists():
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        _write_key(pki.service_account_key, key)
        pki.service_account_public_key.write_bytes(
            key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )
    return pki


class _Signer:
    def __init__(self, ca: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> None:
        self._ca = ca
        self._key = key

    def issue(  # noqa: PLR0917  (one call per certificate reads best positionally)
        self,
        pki: Pki,
        name: str,
        common_name: str,
        groups: tuple[str, ...],
        hosts: list[str],
        usages: tuple[x509.ObjectIdentifier, ...],
    ) -> None:
        if pki.cert(name).exists() and pki.key(name).exists():
            return
        key = _load_or_create_key(pki.key(name))
        subject = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, g) for g in groups]
        subject.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
        builder = (
            _certificate(x509.Name(subject), self._ca.subject, key)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(_key_usage(ca=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage(list(usages)), critical=False)
        )
        if hosts:
            names: list[x509.GeneralName] = []
            for host in hosts:
                try:
                    names.append(x509.IPAddress(ipaddress.ip_address(host)))
                except ValueError:
                    names.append(x509.DNSName(host))
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        _write_cert(pki.cert(name), builder.sign(self._key, hashes.SHA256()))


def _self_signed_ca(key: ec.EllipticCurvePrivateKey) -> x509.Certificate:
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gregor-localkube-ca")])
    return (
        _certificate(name, name, key)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(_key_usage(ca=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )


def _certificate(
    subject: x509.Name, issuer: x509.Name, key: ec.EllipticCurvePrivateKey
) -> x509.CertificateBuilder:
    """What every certificate here shares: names, key, a random serial, ten years' validity
    (from five minutes ago, for clocks a little behind)."""
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + VALIDITY)
    )


def _key_usage(*, ca: bool) -> x509.KeyUsage:
    """Signatures for every certificate; signing certificates and CRLs for the CA alone."""
    return x509.KeyUsage(
        digital_signature=True,
        key_encipherment=False,
        content_commitment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=ca,
        crl_sign=ca,
        encipher_only=False,
        decipher_only=False,
    )


def _load_or_create_key(path: Path) -> ec.EllipticCurvePrivateKey:
    if path.exists():
        key = serialization.load_pem_private_key(path.read_bytes(), password=None)
        assert isinstance(key, ec.EllipticCurvePrivateKey)
        return key
    key = ec.generate_private_key(ec.SECP256R1())
    _write_key(path, key)
    return key


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)


def _write_cert(path: Path, cert: x509.Certificate) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
