"""Certificates and kubeconfigs for the dev cluster's control plane.

One self-signed CA (ECDSA P-256) signs: the kube-apiserver serving certificate
(SANs ``127.0.0.1``, ``localhost``, the first service IP and the ``kubernetes.default``
names) and client certificates whose subject carries the Kubernetes identity
(CN = user, O = groups): the admin (``system:masters``), the controller manager,
the scheduler and one ``system:node:<name>`` per node (group ``system:nodes``, so the
Node authorizer and NodeRestriction admission apply to nodes exactly as to kubelets).
A separate RSA key pair signs and verifies service-account tokens.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from pathlib import Path

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = ["Pki", "write_kubeconfig"]

_VALIDITY = dt.timedelta(days=365)


def _name(cn: str, orgs: tuple[str, ...] = ()) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in orgs]
    attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, cn))
    return x509.Name(attrs)


def _write_key(path: Path, key) -> None:
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    path.chmod(0o600)


class Pki:
    """The dev cluster's certificate authority and issued files, under ``directory``.

    Files: ``ca.crt``/``ca.key``, ``apiserver.crt``/``.key``, ``<user>.crt``/``.key`` per
    client, ``sa.key``/``sa.pub`` (RSA 2048, service-account token signing).
    """

    def __init__(self, directory: Path) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        if (self.dir / "ca.crt").exists():
            self._ca_key = serialization.load_pem_private_key((self.dir / "ca.key").read_bytes(), None)
            self._ca_cert = x509.load_pem_x509_certificate((self.dir / "ca.crt").read_bytes())
        else:
            self._create_ca()

    @property
    def ca_cert(self) -> Path:
        """The CA certificate (PEM)."""
        return self.dir / "ca.crt"

    @property
    def ca_key(self) -> Path:
        """The CA private key (PEM)."""
        return self.dir / "ca.key"

    def _create_ca(self) -> None:
        key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.timezone.utc)
        name = _name("lifeline-devcluster-ca")
        cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
                .public_key(key.public_key()).serial_number(x509.random_serial_number())
                .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + _VALIDITY)
                .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                             content_commitment=False, key_encipherment=False,
                                             data_encipherment=False, key_agreement=False,
                                             encipher_only=False, decipher_only=False), critical=True)
                .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
                .sign(key, hashes.SHA256()))
        _write_key(self.ca_key, key)
        self.ca_cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        self._ca_key, self._ca_cert = key, cert

    def issue(self, stem: str, cn: str, *, orgs: tuple[str, ...] = (), server: bool = False,
              dns: tuple[str, ...] = (), ips: tuple[str, ...] = ()) -> tuple[Path, Path]:
        """Issue a certificate ``<stem>.crt``/``<stem>.key`` signed by the CA.

        Args:
            stem: file name stem.
            cn: common name (the Kubernetes user name for client certificates).
            orgs: organisations (the Kubernetes groups).
            server: a serving certificate (server auth + SANs) instead of a client one.
            dns, ips: subject alternative names for serving certificates.

        Returns:
            ``(cert_path, key_path)``.
        """
        key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.timezone.utc)
        b = (x509.CertificateBuilder().subject_name(_name(cn, orgs)).issuer_name(self._ca_cert.subject)
             .public_key(key.public_key()).serial_number(x509.random_serial_number())
             .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + _VALIDITY)
             .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
             .add_extension(x509.ExtendedKeyUsage(
                 [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH] if server
                 else [ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
             .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(self._ca_key.public_key()),
                            critical=False))
        if server:
            sans = [x509.DNSName(d) for d in dns] + [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
            b = b.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = b.sign(self._ca_key, hashes.SHA256())
        crt, kp = self.dir / f"{stem}.crt", self.dir / f"{stem}.key"
        _write_key(kp, key)
        crt.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        return crt, kp

    def service_account_keys(self) -> tuple[Path, Path]:
        """Create (once) the RSA key pair signing service-account tokens; returns ``(sa.key, sa.pub)``."""
        priv, pub = self.dir / "sa.key", self.dir / "sa.pub"
        if not priv.exists():
            key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
            _write_key(priv, key)
            pub.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                          serialization.PublicFormat.SubjectPublicKeyInfo))
        return priv, pub


def write_kubeconfig(path: Path, *, server: str, ca: Path, user: str, cert: Path | None = None,
                     key: Path | None = None, token: str | None = None, namespace: str = "default") -> Path:
    """Write a kubeconfig with one cluster/user/context (``lifeline``), file mode 0600.

    Credentials are either a client certificate (``cert``/``key`` paths) or a bearer ``token``.
    """
    creds: dict = {}
    if cert is not None:
        creds = {"client-certificate": str(cert), "client-key": str(key)}
    if token is not None:
        creds["token"] = token
    cfg = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "lifeline", "cluster": {"server": server, "certificate-authority": str(ca)}}],
        "users": [{"name": user, "user": creds}],
        "contexts": [{"name": "lifeline", "context": {"cluster": "lifeline", "user": user,
                                                      "namespace": namespace}}],
        "current-context": "lifeline",
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(yaml.safe_dump(cfg, sort_keys=False))
    tmp.chmod(0o600)
    tmp.replace(path)
    return path
