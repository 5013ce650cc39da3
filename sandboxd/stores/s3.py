"""Blobs in an S3-compatible object store (AWS S3, MinIO, versitygw, Ceph
RGW...), spoken with aiohttp and a small AWS Signature V4 signer of our own.
Path-style addressing (``endpoint/bucket/key``), which every S3-compatible
server accepts. Batches run as concurrent requests, at most ``concurrency``
at a time. A streamed blob goes up as a multipart upload of PART_BYTES parts
(one PUT when it is no larger) and comes back as ranged GETs of that size, so
neither is ever whole in memory."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import hashlib
import hmac
import urllib.parse
import xml.etree.ElementTree as ET
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar
from xml.sax.saxutils import escape as xml_escape

import aiohttp

from sandboxd.errors import BackendError, NotFound, TransientBackendError

T = TypeVar("T")
_EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
_NS = "{http://s3.amazonaws.com/doc/2006-03-01/}"
# Every part of a multipart upload but the last must be at least 5 MiB.
PART_BYTES = 8 << 20
# An error answer is read this far for its message, whatever its length.
_ERROR_BODY_BYTES = 64 << 10


@dataclass(frozen=True)
class S3Config:
    """How to reach the bucket: endpoint, credentials, region, key prefix, request limits."""

    endpoint: str
    """Base URL, e.g. http://127.0.0.1:7070."""
    bucket: str
    access_key: str
    secret_key: str
    region: str = "us-east-1"
    prefix: str = ""
    """Prepended to every key (several servers can share one bucket)."""
    concurrency: int = 32
    timeout_seconds: float = 60.0
    create_bucket: bool = True
    """Create the bucket on first use if it does not exist."""


def _quote(text: str, safe: str = "-_.~") -> str:
    return urllib.parse.quote(text, safe=safe)


def sign_v4(
    *,
    method: str,
    url: str,
    headers: Mapping[str, str],
    payload_sha256: str,
    access_key: str,
    secret_key: str,
    region: str,
    now: dt.datetime,
    service: str = "s3",
) -> dict[str, str]:
    """Headers to add to a request for AWS Signature Version 4 (header auth)."""
    parts = urllib.parse.urlsplit(url)
    amz_date = now.strftime("%Y%m%dT%H%M%SZ")
    day = amz_date[:8]
    host = parts.netloc
    all_headers = {k.lower(): v.strip() for k, v in headers.items()}
    all_headers["host"] = host
    all_headers["x-amz-date"] = amz_date
    all_headers["x-amz-content-sha256"] = payload_sha256
    signed = sorted(all_headers)
    canonical_headers = "".join(f"{k}:{all_headers[k]}\n" for k in signed)
    query = urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
    canonical_query = "&".join(f"{_quote(k)}={_quote(v)}" for k, v in sorted(query))
    canonical_uri = _quote(urllib.parse.unquote(parts.path) or "/", safe="-_.~/")
    canonical = "\n".join(
        [method, canonical_uri, canonical_query, canonical_headers, ";".join(signed), payload_sha256]
    )
    scope = f"{day}/{region}/{service}/aws4_request"
    to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(canonical.encode()).hexdigest()])
    key = f"AWS4{secret_key}".encode()
    for part in (day, region, service, "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    return {
        "x-amz-date": amz_date,
        "x-amz-content-sha256": payload_sha256,
        "Authorization": (
            f"AWS4-HMAC-SHA256 Credential={access_key}/{scope}, "
            f"SignedHeaders={';'.join(signed)}, Signature={signature}"
        ),
    }


class S3BlobStore:
    """Blobs as objects of one bucket of an S3-compatible server."""

    def __init__(self, config: S3Config) -> None:
        self.config = config
        self._session: aiohttp.ClientSession | None = None
        self._limit = asyncio.Semaphore(config.concurrency)
        self._bucket_ready = False
        self._bucket_lock = asyncio.Lock()

    # -- plumbing -------------------------------------------------------------

    def _url(self, key: str = "", query: Mapping[str, str] | None = None) -> str:
        base = self.config.endpoint.rstrip("/") + "/" + _quote(self.config.bucket)
        if key:
            base += "/" + _quote(self.config.prefix + key, safe="-_.~/")
        if query:
            base += "?" + "&".join(f"{_quote(k)}={_quote(v)}" for k, v in sorted(query.items()))
        return base

    async def _request(
        self,
        method: str,
        url: str,
        *,
        body: bytes = b"",
        ok: tuple[int, ...] = (200,),
        read: bool = True,
        extra_headers: dict[str, str] | None = None,
        reply_headers: dict[str, str] | None = None,
    ) -> tuple[int, bytes]:
        """(status, body) of a signed request; ``reply_headers`` is filled
        with the answer's headers (names in lower case) when given."""
        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.config.timeout_seconds),
                connector=aiohttp.TCPConnector(limit=self.config.concurrency),
                auto_decompress=False,
            )
        payload_hash = hashlib.sha256(body).hexdigest() if body else _EMPTY_SHA256
        headers = sign_v4(
            method=method,
            url=url,
            headers={},
            payload_sha256=payload_hash,
            access_key=self.config.access_key,
            secret_key=self.config.secret_key,
            region=self.config.region,
            now=dt.datetime.now(dt.UTC),
        )
        if extra_headers:
            headers = {**headers, **extra_headers}  # unsigned: SigV4 does not need them signed
        async with self._limit:
            try:
                async with self._session.request(
                    method,
                    url,
                    data=body if body else None,
                    headers=headers,
                    skip_auto_headers=["Content-Type"],
                ) as response:
                    status = response.status
                    if status not in ok:
                        data = await response.content.read(_ERROR_BODY_BYTES)
                    else:
                        data = await response.read() if read else b""
                    if reply_headers is not None:
                        reply_headers.update((k.lower(), v) for k, v in response.headers.items())
            except (aiohttp.ClientError, TimeoutError, OSError) as e:
                raise TransientBackendError(f"S3 {method} {url}: {e}") from e
        if status in ok:
            return status, data
        message = _error_message(data) or f"HTTP {status}"
        if status == 404:
            raise NotFound(f"S3 {method} {url}: {message}")
        if status >= 500 or status == 429:
            raise TransientBackendError(f"S3 {method} {url}: {message}")
        raise BackendError(f"S3 {method} {url}: {message}")

    async def _ensure_bucket(self) -> None:
        if self._bucket_ready or not self.config.create_bucket:
            return
        async with self._bucket_lock:
            if self._bucket_ready:
                return
            status, _ = await self._request("HEAD", self._url(), ok=(200, 404), read=False)
            if status == 404:
                await self._request("PUT", self._url(), ok=(200, 409))
            self._bucket_ready = True

    async def _each(self, items: Sequence[T], fn: Callable[[T], Awaitable[None]]) -> None:
        tasks = [asyncio.ensure_future(fn(item)) for item in items]
        try:
            await asyncio.gather(*tasks)
        except BaseException:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise

    # -- BlobStore ------------------------------------------------------------

    async def _exists(self, key: str) -> bool:
        status, _ = await self._request("HEAD", self._url(key), ok=(200, 404), read=False)
        return status == 200

    async def put_absent(self, blobs: Mapping[str, bytes]) -> int:
        """A HEAD, then a PUT if absent, per blob, concurrently; S3 shows each object only once whole."""
        await self._ensure_bucket()
        written = 0

        async def one(key: str) -> None:
            nonlocal written
            if await self._exists(key):
                return
            await self._request("PUT", self._url(key), body=blobs[key])
            written += len(blobs[key])

        await self._each(list(blobs), one)
        return written

    async def put_parts(self, key: str, parts: Sequence[bytes]) -> int:
        """The parts joined into one PUT, unless the key is present."""
        return await self.put_absent({key: b"".join(parts)})

    async def put_stream(self, key: str, chunks: AsyncIterator[bytes], size: int) -> int:
        """As BlobStore.put_stream: one PUT up to PART_BYTES, a multipart
        upload above (aborted on any failure, so nothing is left)."""
        await self._ensure_bucket()
        if await self._exists(key):
            return 0
        if size <= PART_BYTES:
            body = bytearray()
            async for chunk in chunks:
                body += chunk
                if len(body) > size:
                    break
            _check_count(key, len(body), size)
            await self._request("PUT", self._url(key), body=bytes(body))
            return size
        upload = await self._start_upload(key)
        try:
            etags: list[str] = []
            buf = bytearray()
            count = 0
            async for chunk in chunks:
                count += len(chunk)
                if count > size:
                    break
                buf += chunk
                while len(buf) >= PART_BYTES:
                    part = bytes(buf[:PART_BYTES])
                    del buf[:PART_BYTES]
                    etags.append(await self._upload_part(key, upload, len(etags) + 1, part))
            _check_count(key, count, size)
            if buf:
                etags.append(await self._upload_part(key, upload, len(etags) + 1, bytes(buf)))
            await self._complete_upload(key, upload, etags)
        except BaseException:
            # Shielded: a cancelled caller must not leave the parts stored.
            with contextlib.suppress(Exception):
                await asyncio.shield(self._abort_upload(key, upload))
            raise
        return size

    async def _start_upload(self, key: str) -> str:
        _, body = await self._request("POST", self._url(key, {"uploads": ""}))
        upload = _xml(body, "initiate multipart upload").findtext(f"{_NS}UploadId") or ""
        if not upload:
            raise BackendError(f"S3 multipart upload of {key}: no UploadId in the answer")
        return upload

    async def _upload_part(self, key: str, upload: str, number: int, data: bytes) -> str:
        headers: dict[str, str] = {}
        url = self._url(key, {"partNumber": str(number), "uploadId": upload})
        await self._request("PUT", url, body=data, read=False, reply_headers=headers)
        etag = headers.get("etag", "")
        if not etag:
            raise BackendError(f"S3 multipart upload of {key}: part {number} came back without an ETag")
        return etag

    async def _complete_upload(self, key: str, upload: str, etags: list[str]) -> None:
        parts = "".join(
            f"<Part><PartNumber>{i}</PartNumber><ETag>{xml_escape(etag)}</ETag></Part>"
            for i, etag in enumerate(etags, 1)
        )
        doc = f"<CompleteMultipartUpload>{parts}</CompleteMultipartUpload>".encode()
        _, body = await self._request("POST", self._url(key, {"uploadId": upload}), body=doc)
        # S3 may answer 200 and still report a failure in the body.
        root = _xml(body, "complete multipart upload")
        if root.tag.endswith("Error"):
            raise BackendError(f"S3 multipart upload of {key} failed: {_error_message(body)}")

    async def _abort_upload(self, key: str, upload: str) -> None:
        await self._request("DELETE", self._url(key, {"uploadId": upload}), ok=(200, 204, 404), read=False)

    async def read_stream(self, key: str, offset: int, size: int) -> AsyncIterator[bytes]:
        """As BlobStore.read_stream: one ranged GET per PART_BYTES, none
        holding a connection while the caller works on the last."""
        await self._ensure_bucket()
        pos, end = offset, offset + size
        while pos < end:
            stop = min(end, pos + PART_BYTES)
            try:
                _, data = await self._request(
                    "GET", self._url(key), ok=(206,), extra_headers={"Range": f"bytes={pos}-{stop - 1}"}
                )
            except NotFound as e:
                raise NotFound(f"blob {key} is missing from the store") from e
            except BackendError as e:
                if "InvalidRange" in str(e) or "416" in str(e):
                    raise BackendError(f"blob {key} ends before {end} (truncated?)") from e
                raise
            if not data or len(data) > stop - pos:
                raise BackendError(f"blob {key}: ranged read at {pos} answered {len(data)} bytes")
            pos += len(data)
            yield data

    async def get_many(self, keys: Sequence[str]) -> dict[str, bytes]:
        """A GET per distinct key, concurrently; NotFound naming a missing key (the rest are cancelled)."""
        await self._ensure_bucket()
        out: dict[str, bytes] = {}

        async def one(key: str) -> None:
            try:
                _, out[key] = await self._request("GET", self._url(key))
            except NotFound as e:
                raise NotFound(f"blob {key} is missing from the store") from e

        await self._each(list(dict.fromkeys(keys)), one)
        return out

    async def get_ranges(self, key: str, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        """One ranged GET covering every range (they are mostly adjacent)."""
        if not ranges:
            return []
        await self._ensure_bucket()
        start = min(offset for offset, _ in ranges)
        end = max(offset + size for offset, size in ranges)
        if end == start:
            return [b"" for _ in ranges]
        try:
            status, data = await self._request(
                "GET", self._url(key), ok=(200, 206), extra_headers={"Range": f"bytes={start}-{end - 1}"}
            )
        except NotFound as e:
            raise NotFound(f"blob {key} is missing from the store") from e
        if status == 200:  # a server that ignores Range sends the whole object
            data = data[start:end]
        if len(data) != end - start:
            raise BackendError(f"blob {key} ends before {end} (truncated?)")
        return [data[offset - start : offset - start + size] for offset, size in ranges]

    async def missing(self, keys: Sequence[str]) -> set[str]:
        """A HEAD per distinct key, concurrently; those answering 404."""
        await self._ensure_bucket()
        out: set[str] = set()

        async def one(key: str) -> None:
            if not await self._exists(key):
                out.add(key)

        await self._each(list(dict.fromkeys(keys)), one)
        return out

    async def delete_many(self, keys: Sequence[str]) -> None:
        """A DELETE per distinct key, concurrently; a missing object (404) counts as deleted."""
        await self._ensure_bucket()

        async def one(key: str) -> None:
            await self._request("DELETE", self._url(key), ok=(200, 204, 404), read=False)

        await self._each(list(dict.fromkeys(keys)), one)

    async def list_keys(self, prefix: str = "") -> list[str]:
        """Keys under ``prefix`` by ListObjectsV2, page by page; the configured prefix added and stripped."""
        await self._ensure_bucket()
        out: list[str] = []
        token = ""
        full_prefix = self.config.prefix + prefix
        while True:
            query = {"list-type": "2", "prefix": full_prefix, "max-keys": "1000"}
            if token:
                query["continuation-token"] = token
            _, body = await self._request("GET", self._url(query=query))
            try:
                root = ET.fromstring(body)
            except ET.ParseError as e:
                raise BackendError(f"S3 list: unreadable answer: {e}") from e
            for item in root.iter(f"{_NS}Contents"):
                key = item.findtext(f"{_NS}Key") or ""
                out.append(key[len(self.config.prefix) :])
            truncated = (root.findtext(f"{_NS}IsTruncated") or "").lower() == "true"
            token = root.findtext(f"{_NS}NextContinuationToken") or ""
            if not truncated or not token:
                return out

    async def close(self) -> None:
        """Closes the HTTP session and its connections; a later request would open a new one."""
        if self._session is not None:
            await self._session.close()
            self._session = None


def _check_count(key: str, count: int, size: int) -> None:
    if count > size:
        raise BackendError(f"blob {key}: the stream holds more than the {size} bytes announced")
    if count < size:
        raise BackendError(f"blob {key}: the stream ended after {count} of the {size} bytes announced")


def _xml(body: bytes, what: str) -> ET.Element:
    try:
        return ET.fromstring(body)
    except ET.ParseError as e:
        raise BackendError(f"S3 {what}: unreadable answer: {e}") from e


def _error_message(body: bytes) -> str:
    if not body:
        return ""
    try:
        root = ET.fromstring(body)
    except ET.ParseError:
        return body[:200].decode(errors="replace")
    code = root.findtext("Code") or ""
    message = root.findtext("Message") or ""
    return f"{code}: {message}".strip(": ")
