"""S3's upload path for large buffers in memory (``S3Storage.uploader()``; the sidecar's L2 persister
uses it): a parallel multipart upload straight from arena memory.

Same protocol, part size and parallelism as the checkpoint library's ``S3Storage.put`` (minio
client), with three differences on the hot path:

* parts are ``memoryview`` slices of the arena slot handed to urllib3 as request bodies: no
  stream reader, no ``bytes`` copy per part;
* the payload is signed as ``UNSIGNED-PAYLOAD`` (SigV4 headers still signed) instead of a SHA-256
  of every part: minio-py already does this over TLS, and over plain HTTP it otherwise costs one
  SHA-256 pass on the client and one more on the server for every byte;
* integrity in transit comes from S3's additional checksums instead: each part carries its
  ``x-amz-checksum-crc32c`` (crc32c runs ~8x faster than SHA-256 here and releases the GIL) and the
  server rejects a part whose bytes do not match. End to end, restores verify every byte against
  the chunk checksums sealed at save time (invariant 4).

Requests are signed with minio's SigV4 signer (``minio.signer.sign_v4_s3``); transient failures
(connection errors, 5xx, ``SlowDown``) are retried per request with exponential backoff; a failed
upload is aborted so the object never becomes visible (S3 completes multipart objects atomically).
"""

from __future__ import annotations

import base64
import random
import threading
import time
import xml.etree.ElementTree as ET
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import quote, urlsplit

import urllib3

from lifeline.checkpoint._crc import crc32c
from lifeline.errors import StorageError

__all__ = ["S3Uploader"]

_TRANSIENT = {"SlowDown", "InternalError", "ServiceUnavailable", "RequestTimeout", "XMinioServerNotInitialized",
              "OperationAborted"}
_NS = "{http://s3.amazonaws.com/doc/2006-03-01/}"


class S3Uploader:
    """Uploads one buffer per call to ``bucket/key`` (parallel multipart above ``part_size`` bytes).

    Args:
        endpoint: ``host:port`` of the S3 server.
        access_key, secret_key: credentials.
        bucket: the bucket (created on first use when missing).
        secure: HTTPS instead of HTTP.
        part_size: bytes per part (>= 5 MiB, S3's minimum for all but the last part).
        concurrency: parts in flight at once (and pooled connections).
        retries: attempts per request after the first on transient errors.
        backoff_s: first retry delay in seconds (doubles, plus jitter).
        timeout_s: connect/read timeout per request, seconds.
    """

    def __init__(self, endpoint: str, access_key: str, secret_key: str, bucket: str, *, secure: bool = False,
                 part_size: int = 16 << 20, concurrency: int = 8, retries: int = 5, backoff_s: float = 0.1,
                 timeout_s: float = 60.0) -> None:
        from minio.credentials import Credentials

        if part_size < 5 << 20:
            raise StorageError(f"part_size={part_size} is below S3's 5 MiB minimum")
        self.base = f"{'https' if secure else 'http'}://{endpoint}"
        self.host, self.bucket, self.part_size = endpoint, bucket, part_size
        self.concurrency, self.retries, self.backoff_s = max(1, concurrency), retries, backoff_s
        self.creds = Credentials(access_key, secret_key)
        self.http = urllib3.PoolManager(
            maxsize=self.concurrency + 1, timeout=urllib3.Timeout(connect=min(10.0, timeout_s), read=timeout_s),
            retries=urllib3.Retry(total=0, connect=0, read=0, redirect=0, status=0),
        )
        self.pool = ThreadPoolExecutor(self.concurrency, thread_name_prefix="l2-part")
        self._region: str | None = None
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ requests
    def _request(self, method: str, key: str, query: str = "", body: Any = None, headers: dict | None = None,
                 *, region: str | None = None) -> urllib3.BaseHTTPResponse:
        """One signed request, retried on transient errors; returns a 2xx response (body read)."""
        from minio import time as mtime
        from minio.signer import sign_v4_s3

        path = f"/{self.bucket}" + (f"/{quote(key)}" if key else "")
        url = f"{self.base}{path}" + (f"?{query}" if query else "")
        delay = self.backoff_s
        for attempt in range(self.retries + 1):
            date = mtime.utcnow()
            hdrs = {"Host": self.host, "x-amz-date": mtime.to_amz_date(date),
                    "x-amz-content-sha256": "UNSIGNED-PAYLOAD", **(headers or {})}
            if body is not None:
                hdrs["Content-Length"] = str(len(body))
            hdrs = sign_v4_s3(method=method, url=urlsplit(url), region=region or self.region(), headers=hdrs,
                              credentials=self.creds, content_sha256="UNSIGNED-PAYLOAD", date=date)
            try:
                resp = self.http.urlopen(method, url, body=body, headers=hdrs, preload_content=True)
            except (urllib3.exceptions.HTTPError, OSError) as err:
                if attempt == self.retries:
                    raise StorageError(f"{method} {path}?{query} failed after {attempt + 1} attempts: {err}",
                                       key=key) from err
            else:
                if 200 <= resp.status < 300:
                    return resp
                code, message = _error(resp)
                if (code not in _TRANSIENT and resp.status < 500) or attempt == self.retries:
                    raise StorageError(f"{method} {path}?{query} failed: HTTP {resp.status} {code}: {message}", key=key)
            time.sleep(delay * (1 + random.random()))
            delay *= 2
        raise AssertionError("unreachable")

    def region(self) -> str:
        """The bucket's region (GetBucketLocation once, signed for us-east-1 as S3 allows); creates the
        bucket when it is missing."""
        if self._region is None:
            with self._lock:
                if self._region is None:
                    try:
                        resp = self._request("GET", "", "location=", region="us-east-1")
                    except StorageError as err:
                        if "NoSuchBucket" not in str(err):
                            raise
                        self._request("PUT", "", region="us-east-1")
                        resp = self._request("GET", "", "location=", region="us-east-1")
                    self._region = (ET.fromstring(resp.data).text or "").strip() or "us-east-1"
        return self._region

    # ------------------------------------------------------------------ upload
    def put(self, key: str, data: Any) -> None:
        """Upload the bytes of ``data`` (any buffer; not copied) as object ``key``.

        Raises:
            StorageError: a request failed after its retries (a started multipart upload is aborted).
        """
        view = memoryview(data).cast("B")
        if len(view) <= self.part_size:
            self._request("PUT", key, body=view, headers=_crc_header(view))
            return
        resp = self._request("POST", key, "uploads=", headers={"x-amz-checksum-algorithm": "CRC32C"})
        upload_id = ET.fromstring(resp.data).findtext(f"{_NS}UploadId") or ""
        if not upload_id:
            raise StorageError(f"CreateMultipartUpload of {key} returned no upload id", key=key)
        uid = quote(upload_id, safe="")
        try:
            offsets = range(0, len(view), self.part_size)
            futs = [self.pool.submit(self._part, key, uid, i + 1, view[o : o + self.part_size])
                    for i, o in enumerate(offsets)]
            parts = [f.result() for f in futs]
            xml = "".join(f"<Part><PartNumber>{i}</PartNumber><ETag>{etag}</ETag><ChecksumCRC32C>{crc}</ChecksumCRC32C>"
                          "</Part>" for i, etag, crc in parts)
            body = f"<CompleteMultipartUpload>{xml}</CompleteMultipartUpload>".encode()
            resp = self._request("POST", key, f"uploadId={uid}", body=body, headers={"Content-Type": "application/xml"})
            if b"<Error>" in resp.data:  # S3 may answer 200 with an error document
                code, message = _error(resp)
                raise StorageError(f"CompleteMultipartUpload of {key} failed: {code}: {message}", key=key)
        except BaseException:
            try:
                self._request("DELETE", key, f"uploadId={uid}")
            except StorageError:
                pass  # the bucket's lifecycle rules reap abandoned uploads
            raise

    def _part(self, key: str, uid: str, number: int, view: memoryview) -> tuple[int, str, str]:
        hdr = _crc_header(view)
        resp = self._request("PUT", key, f"partNumber={number}&uploadId={uid}", body=view, headers=hdr)
        etag = resp.headers.get("ETag", "")
        if not etag:
            raise StorageError(f"part {number} of {key} got no ETag", key=key)
        return number, etag, hdr["x-amz-checksum-crc32c"]

    def close(self) -> None:
        """Stop taking parts (queued ones are cancelled, running ones end on their own) and close pooled
        connections."""
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.http.clear()


def _crc_header(view: memoryview) -> dict[str, str]:
    return {"x-amz-checksum-crc32c": base64.b64encode(crc32c(view).to_bytes(4, "big")).decode()}


def _error(resp: urllib3.BaseHTTPResponse) -> tuple[str, str]:
    try:
        root = ET.fromstring(resp.data)
        return root.findtext("Code") or "", root.findtext("Message") or ""
    except ET.ParseError:
        return "", resp.data[:200].decode(errors="replace")
