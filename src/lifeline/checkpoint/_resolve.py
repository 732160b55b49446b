"""One resolver from a checkpoint URI to a storage: :func:`storage_from_uri` over :data:`SCHEMES`.

Every caller (the sidecar's persister, the runtime's L2 reads, ``lifeline run``'s services, the
``ckpt`` and ``densify`` commands, the benches) builds one :class:`StorageOptions` from its own
settings and passes it here; none of them branches on a URI scheme. Adding a backend is one module
plus one line in :data:`SCHEMES`: an opener ``(uri, options) -> (storage, prefix)`` that imports its
client library lazily, so a job that never names the scheme never loads it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from lifeline.checkpoint._storage import Storage
from lifeline.errors import StorageError

__all__ = ["StorageOptions", "SCHEMES", "storage_from_uri", "uri_scheme"]


@dataclass(frozen=True)
class StorageOptions:
    """How to reach the storage a URI names; each backend reads the fields it needs.

    Attributes:
        endpoint: object storage ``host:port`` (``s3://``), account URL (``az://``) or JSON API base URL
            (``gs://``); ``None``: the environment's (``LIFELINE_S3_ENDPOINT``; ``LIFELINE_AZURE_ENDPOINT``;
            ``LIFELINE_GCS_ENDPOINT``, else Google's).
        access_key: the S3 access key, the Azure account name or the GCS project (for new buckets); ``None``:
            the environment's (``AWS_ACCESS_KEY_ID``; ``LIFELINE_AZURE_ACCOUNT``; the credentials').
        secret_key: the S3 secret key, the Azure account key or the path of a GCS service-account JSON key
            file; ``None``: the environment's (``AWS_SECRET_ACCESS_KEY``; ``LIFELINE_AZURE_KEY``; application
            default credentials, anonymous when a GCS endpoint is given).
        secure: TLS to the endpoint.
        retries: attempts per request after the first on transient errors; ``None``: the backend's.
        fsync: the filesystem backend flushes each object to disk before it is visible.
        tuning: backend constructor extras (``part_size``, ``max_concurrency``, ``direct``, ...), passed
            as keyword arguments; an unknown one is a :class:`StorageError` naming it.
    """

    endpoint: str | None = None
    access_key: str | None = None
    secret_key: str | None = field(default=None, repr=False)
    secure: bool = False
    retries: int | None = None
    fsync: bool = True
    tuning: Mapping[str, Any] = field(default_factory=dict)

    def credentials(self, scheme: str, endpoint_env: str, access_env: str, secret_env: str,
                    uri: str) -> tuple[str, str, str]:
        """``(endpoint, access, secret)`` from the options, else the named environment variables.

        Raises:
            StorageError: one of the three is missing (naming the URI and the variables).
        """
        endpoint = self.endpoint or os.environ.get(endpoint_env)
        access = self.access_key or os.environ.get(access_env)
        secret = self.secret_key or os.environ.get(secret_env)
        if not endpoint or not access or not secret:
            raise StorageError(f"{uri}: {scheme} storage needs an endpoint and credentials (options or "
                               f"{endpoint_env}, {access_env}, {secret_env})", key=uri)
        return endpoint, access, secret


def _build(cls: Callable[..., Storage], uri: str, *args: Any, **kwargs: Any) -> Storage:
    try:
        return cls(*args, **kwargs)
    except TypeError as err:  # an option this backend does not take
        raise StorageError(f"{uri}: {err}; check StorageOptions.tuning", key=uri) from err


def _open_s3(uri: str, options: StorageOptions) -> tuple[Storage, str]:
    from lifeline.checkpoint._s3 import S3Storage  # the S3 client (minio, urllib3) only for s3:// users

    bucket, _, prefix = uri[len("s3://"):].partition("/")
    if not bucket:
        raise StorageError(f"{uri}: an s3:// URI needs a bucket (s3://bucket/prefix)", key=uri)
    endpoint, access, secret = options.credentials("S3", "LIFELINE_S3_ENDPOINT", "AWS_ACCESS_KEY_ID",
                                                   "AWS_SECRET_ACCESS_KEY", uri)
    extra = dict(options.tuning)
    if options.retries is not None:
        extra["retries"] = options.retries
    return _build(S3Storage, uri, endpoint, access, secret, bucket, options.secure, **extra), prefix.strip("/")


def _open_azure(uri: str, options: StorageOptions) -> tuple[Storage, str]:
    from lifeline.checkpoint._azure import AzureStorage  # the Azure SDK only for az:// users (extra "azure")

    container, _, prefix = uri[len("az://"):].partition("/")
    if not container:
        raise StorageError(f"{uri}: an az:// URI needs a container (az://container/prefix)", key=uri)
    endpoint = options.endpoint or os.environ.get("LIFELINE_AZURE_ENDPOINT")
    account = options.access_key or os.environ.get("LIFELINE_AZURE_ACCOUNT") or os.environ.get("AZURE_STORAGE_ACCOUNT")
    key = options.secret_key or os.environ.get("LIFELINE_AZURE_KEY") or os.environ.get("AZURE_STORAGE_KEY")
    if not account or not key:
        raise StorageError(f"{uri}: Azure storage needs an account and its key (options or LIFELINE_AZURE_ACCOUNT, "
                           "LIFELINE_AZURE_KEY; the endpoint defaults to https://<account>.blob.core.windows.net)",
                           key=uri)
    extra = dict(options.tuning)
    if options.retries is not None:
        extra["retries"] = options.retries
    return _build(AzureStorage, uri, endpoint, account, key, container, **extra), prefix.strip("/")


def _open_gcs(uri: str, options: StorageOptions) -> tuple[Storage, str]:
    """``gs://bucket/prefix``: Google Cloud Storage, or an emulator when an endpoint is given.

    The endpoint is ``options.endpoint`` or ``LIFELINE_GCS_ENDPOINT`` (a base URL; ``host:port`` gets
    ``http://``, or ``https://`` when ``options.secure``); without one, Google's. Credentials: with an
    endpoint and no key file, none (anonymous: fake-gcs-server); else the service-account JSON key file
    named by ``options.secret_key``, else application default credentials (``GOOGLE_APPLICATION_CREDENTIALS``,
    gcloud's login, the metadata server), looked up on the first request. ``options.access_key``: the
    project new buckets are created in (default: the credentials').
    """
    from lifeline.checkpoint._gcs import GCSStorage  # the GCS client only for gs:// users (extra "gcs")

    bucket, _, prefix = uri[len("gs://"):].partition("/")
    if not bucket:
        raise StorageError(f"{uri}: a gs:// URI needs a bucket (gs://bucket/prefix)", key=uri)
    endpoint = options.endpoint or os.environ.get("LIFELINE_GCS_ENDPOINT") or None
    if endpoint and "://" not in endpoint:
        endpoint = ("https://" if options.secure else "http://") + endpoint
    credentials = options.secret_key or ("anonymous" if endpoint else None)
    extra = dict(options.tuning)
    if options.retries is not None:
        extra["retries"] = options.retries
    return (_build(GCSStorage, uri, bucket, endpoint=endpoint, credentials=credentials,
                   project=options.access_key or None, **extra), prefix.strip("/"))


def _open_file(uri: str, options: StorageOptions) -> tuple[Storage, str]:
    from lifeline.checkpoint._backends import FilesystemStorage  # numpy: not for `lifeline --help`

    path = uri[len("file://"):] if uri.startswith("file://") else uri
    if not path:
        raise StorageError(f"{uri!r}: a file URI needs a path (file:///absolute/path)", key=uri)
    return _build(FilesystemStorage, uri, path, fsync=options.fsync, **dict(options.tuning)), ""


def _open_memory(uri: str, options: StorageOptions) -> tuple[Storage, str]:
    from lifeline.checkpoint._backends import MemoryStorage

    return MemoryStorage(), uri[len("memory://"):].strip("/")


SCHEMES: dict[str, Callable[[str, StorageOptions], tuple[Storage, str]]] = {
    "s3": _open_s3,
    "az": _open_azure,
    "gs": _open_gcs,
    "file": _open_file,
    "memory": _open_memory,
}
"""URI scheme -> opener ``(uri, options) -> (storage, prefix)``. A plain path is ``file``."""


def uri_scheme(uri: str) -> str:
    """The scheme of ``uri`` (``"file"`` for a plain path)."""
    scheme, sep, _ = uri.partition("://")
    return scheme.lower() if sep else "file"


def storage_from_uri(uri: str, options: StorageOptions | None = None) -> tuple[Storage, str]:
    """``(storage, prefix)`` for a checkpoint root URI.

    ``s3://bucket/prefix`` (S3 or MinIO), ``az://container/prefix`` (Azure Blob Storage or Azurite),
    ``gs://bucket/prefix`` (Google Cloud Storage or fake-gcs-server), ``file:///path`` or a plain path
    (the storage root is the path, the prefix empty), ``memory://prefix`` (a fresh
    :class:`MemoryStorage`), and every other scheme of :data:`SCHEMES`.

    Raises:
        StorageError: an unknown scheme (naming the known ones), a URI without its bucket or path,
            missing endpoint or credentials, or an option the backend does not take.
    """
    scheme = uri_scheme(uri)
    opener = SCHEMES.get(scheme)
    if opener is None:
        known = ", ".join(f"{s}://" for s in sorted(SCHEMES))
        raise StorageError(f"{uri}: unknown storage scheme {scheme!r}; use one of {known} or a path", key=uri)
    return opener(uri, options or StorageOptions())
