"""The shared services of a local run: the Redis catalog and the L2 store.

* Redis: a real ``redis-server`` on loopback (:class:`lifeline.devcluster.services.RedisServer`),
  fresh for every run (the catalog is rebuilt; checkpoints survive in L2), with a random password
  for its default user (the launcher's own connection) and the job's ACL user, allowed only the
  job's keys (:meth:`lifeline.catalog.Catalog.grant_job_user`), whose credentials the ranks get
  through the job Secret's ``redis-username``/``redis-password``, as on Kubernetes.
* L2: ``--persist-uri`` if given; else the spec's ``checkpoint.persist.uri`` — a ``file://`` URI
  as written, an ``s3://`` URI on ``--s3-endpoint`` if given, otherwise on a MinIO server started
  here with its data under the state dir (so a second run with the same state dir finds the
  checkpoints of the first); an ``az://`` URI on the account of ``LIFELINE_AZURE_ACCOUNT``/
  ``LIFELINE_AZURE_KEY`` (``LIFELINE_AZURE_ENDPOINT`` or ``--s3-endpoint``: its account URL) if
  given, otherwise on an Azurite blob service started here the same way; a ``gs://`` URI on
  ``LIFELINE_GCS_ENDPOINT`` (or ``--s3-endpoint``) if given, on Google Cloud Storage with the
  application default credentials when ``GOOGLE_APPLICATION_CREDENTIALS`` is set, otherwise on a
  fake-gcs-server started here (built from source, objects under the state dir). The ranks get the object
  store's endpoint and credentials through the pod settings' object-storage fields (named
  ``s3_*``: for ``az://`` they carry the account URL, account and key; the one resolver,
  :func:`lifeline.checkpoint.storage_from_uri`, reads them by scheme). No ``persist`` in the spec
  and no ``--persist-uri``: no L2.
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lifeline.api import TrainingJob
from lifeline.catalog import Catalog
from lifeline.checkpoint import Storage, StorageOptions, storage_from_uri
from lifeline.devcluster.services import MinioServer, RedisServer
from lifeline.errors import ConfigError

__all__ = ["Services", "start_services", "prepare_binaries", "ensure_bucket"]


@dataclass
class Services:
    """Running services and how the ranks reach them.

    Attributes:
        redis_url: the catalog URL.
        persist_uri: the L2 URI handed to the sidecars (``None``: no L2).
        s3_endpoint, s3_access_key, s3_secret_key: object storage for ``s3://`` URIs.
        redis_password: the Redis default user's password (the launcher's connection).
        redis_job_username, redis_job_password: the job's ACL user (the ranks' connections).
        servers: the servers started here (stopped by :meth:`stop`).
    """

    redis_url: str
    redis_password: str = ""
    redis_job_username: str = ""
    redis_job_password: str = ""
    persist_uri: str | None = None
    s3_endpoint: str = ""
    s3_access_key: str = ""
    s3_secret_key: str = ""
    servers: list[Any] = field(default_factory=list)

    def storage(self) -> tuple[Storage, str] | None:
        """``(storage, prefix)`` of the L2 store (``None`` without L2)."""
        if not self.persist_uri:
            return None
        return storage_from_uri(self.persist_uri, StorageOptions(
            endpoint=self.s3_endpoint, access_key=self.s3_access_key, secret_key=self.s3_secret_key))

    def catalog(self, job: str, world_size: int) -> Catalog:
        """An admin :class:`~lifeline.catalog.Catalog` of ``job`` (the default user's password)."""
        return Catalog(self.redis_url, job, world_size, username="", password=self.redis_password)

    def pids(self) -> dict[str, int]:
        """Process ids of the servers started here, by name."""
        return {s.name: s.pid for s in self.servers if getattr(s, "pid", None)}

    def stop(self) -> None:
        """Stop every server started here (never raises)."""
        for server in reversed(self.servers):
            try:
                server.stop()
            except Exception:  # noqa: BLE001 - best effort at shutdown
                pass
        self.servers.clear()


def prepare_binaries(job: TrainingJob, *, persist_uri: str | None = None, s3_endpoint: str = "") -> float:
    """Build what :func:`start_services` will run and is not built yet (MinIO, from source, when the L2
    URI is ``s3://``; Azurite, from npm, when it is ``az://``; neither when ``s3_endpoint`` is given), so
    that a run's wall time leaves the build out.

    Returns:
        Seconds spent (0.0 when nothing was needed or everything was cached).

    Raises:
        ClusterError: the build failed.
    """
    import time

    uri = persist_uri or (job.spec.checkpoint.persist.uri if job.spec.checkpoint.persist else None)
    if uri is None or s3_endpoint or not uri.startswith(("s3://", "az://", "gs://")):
        return 0.0
    t0 = time.monotonic()
    if uri.startswith("az://"):
        from lifeline.devcluster.azurite import ensure_azurite

        ensure_azurite()
    elif uri.startswith("gs://"):
        if _gcs_given():
            return 0.0
        from lifeline.devcluster import build

        build.binary("fake-gcs-server")
    else:
        from lifeline.devcluster import build

        build.binary("minio")
    return time.monotonic() - t0


def _gcs_given() -> bool:
    """Whether the environment names a Google Cloud Storage to use (an emulator's endpoint, or a
    service-account key file): ``lifeline run`` then starts no fake-gcs-server for ``gs://``."""
    return bool(os.environ.get("LIFELINE_GCS_ENDPOINT") or os.environ.get("GOOGLE_APPLICATION_CREDENTIALS"))


def ensure_bucket(endpoint: str, access: str, secret: str, uri: str) -> None:
    """Create the bucket of ``uri`` (``s3://<bucket>/...``) on the S3 server at ``endpoint``
    (``host:port``, plain HTTP: the local MinIO a run starts) unless it exists.

    Raises:
        minio.error.S3Error: the server refused (credentials, a bucket name S3 rejects).
    """
    from minio import Minio

    bucket = uri[len("s3://"):].split("/", 1)[0]
    client = Minio(endpoint, access_key=access, secret_key=secret, secure=False)
    if not client.bucket_exists(bucket):
        client.make_bucket(bucket)


def start_services(job: TrainingJob, state_dir: Path, *, persist_uri: str | None = None,
                   s3_endpoint: str = "") -> Services:
    """Start Redis and, when needed, MinIO; resolve the L2 URI (rules in the module docstring).

    ``s3_endpoint`` credentials come from ``LIFELINE_S3_ACCESS_KEY``/``LIFELINE_S3_SECRET_KEY``
    (or ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``).

    Raises:
        ConfigError: a persist URI that is neither ``s3://``, ``az://``, ``gs://``, ``file://`` nor a path.
        ClusterError: a server did not start.
    """
    state_dir.mkdir(parents=True, exist_ok=True)
    redis = RedisServer(state_dir=state_dir / "redis", password=secrets.token_hex(32)).start()
    services = Services(redis_url=redis.url, redis_password=redis.password, servers=[redis])
    try:
        admin = services.catalog(job.name or "", 1)
        try:
            services.redis_job_password = secrets.token_hex(32)
            services.redis_job_username = admin.grant_job_user(services.redis_job_password)
        finally:
            admin.close()
        uri = persist_uri or (job.spec.checkpoint.persist.uri if job.spec.checkpoint.persist else None)
        if uri is None:
            return services
        if uri.startswith("s3://"):
            if s3_endpoint:
                access = os.environ.get("LIFELINE_S3_ACCESS_KEY") or os.environ.get("AWS_ACCESS_KEY_ID", "")
                secret = os.environ.get("LIFELINE_S3_SECRET_KEY") or os.environ.get("AWS_SECRET_ACCESS_KEY", "")
                if not access or not secret:
                    raise ConfigError("--s3-endpoint needs credentials in LIFELINE_S3_ACCESS_KEY and "
                                      "LIFELINE_S3_SECRET_KEY", field="--s3-endpoint")
            else:
                minio = MinioServer(state_dir=state_dir / "minio").start()
                services.servers.append(minio)
                s3_endpoint, access, secret = minio.endpoint, minio.access_key, minio.secret_key
            ensure_bucket(s3_endpoint, access, secret, uri)
            services.persist_uri, services.s3_endpoint = uri, s3_endpoint
            services.s3_access_key, services.s3_secret_key = access, secret
        elif uri.startswith("az://"):
            endpoint = s3_endpoint or os.environ.get("LIFELINE_AZURE_ENDPOINT", "")
            account = os.environ.get("LIFELINE_AZURE_ACCOUNT", "")
            key = os.environ.get("LIFELINE_AZURE_KEY", "")
            if not (account and key):  # no account given: the Azure emulator, started here
                from lifeline.devcluster.azurite import AzuriteServer

                azurite = AzuriteServer(state_dir=state_dir / "azurite").start()
                services.servers.append(azurite)
                endpoint, account, key = azurite.endpoint, azurite.account, azurite.key
            services.persist_uri, services.s3_endpoint = uri, endpoint
            services.s3_access_key, services.s3_secret_key = account, key
        elif uri.startswith("gs://"):
            endpoint = s3_endpoint or os.environ.get("LIFELINE_GCS_ENDPOINT", "")
            if not endpoint and not _gcs_given():  # no GCS named: the emulator, started here
                from lifeline.devcluster.fakegcs import FakeGCSServer

                gcs = FakeGCSServer(state_dir=state_dir / "fake-gcs", backend="filesystem").start()
                services.servers.append(gcs)
                endpoint = gcs.endpoint
            services.persist_uri, services.s3_endpoint = uri, endpoint
            services.s3_access_key = os.environ.get("LIFELINE_GCS_PROJECT", "")
        elif uri.startswith("file://") or "://" not in uri:
            path = Path(uri[len("file://"):] if uri.startswith("file://") else uri)
            path.mkdir(parents=True, exist_ok=True)
            services.persist_uri = f"file://{path.resolve()}"
        else:
            raise ConfigError(f"persist URI {uri!r}: use s3://bucket/prefix, az://container/prefix, gs://bucket/prefix, "
                              "file:///path or a path",
                              field="spec.checkpoint.persist.uri")
        return services
    except BaseException:
        services.stop()
        raise
