"""The blob-store port. Keys are opaque '/'-separated strings chosen by the
caller (the snapshot core uses content digests); values are immutable bytes.
Operations take batches so a store can amortise round trips (a thread hop for
the local directory, concurrent requests for S3). A blob of any size can be
written from a stream and read back as one (``put_stream``,
``read_stream``) in bounded memory. Every method raises only
sandboxd.errors types."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Protocol

STREAM_CHUNK_BYTES = 1 << 20
"""The most a store holds of a streamed blob at a time, beyond what one
request needs (an S3 part)."""


class BlobStore(Protocol):
    """The port every blob store implements."""

    async def put_absent(self, blobs: Mapping[str, bytes]) -> int:
        """Stores the blobs whose keys are not present yet (atomically: a key
        is never visible with partial content); returns the bytes written."""
        ...

    async def put_parts(self, key: str, parts: Sequence[bytes]) -> int:
        """Stores one blob given as consecutive parts (a pack of many), unless
        present, without joining them first where the store can; returns
        the bytes written."""
        ...

    async def put_stream(self, key: str, chunks: AsyncIterator[bytes], size: int) -> int:
        """Stores one blob of exactly ``size`` bytes read from ``chunks``, in
        bounded memory however large it is, unless present (``chunks`` is
        then left unread); atomically, as put_absent. BackendError, and
        nothing stored, when the stream holds another count of bytes; an
        error the stream raises is raised, nothing stored. Returns the bytes
        written."""
        ...

    def read_stream(self, key: str, offset: int, size: int) -> AsyncIterator[bytes]:
        """Bytes [offset, offset + size) of one blob, in pieces of bounded
        size. NotFound when the blob is missing, BackendError when it ends
        before offset + size."""
        ...

    async def get_many(self, keys: Sequence[str]) -> dict[str, bytes]:
        """The blobs' contents. Raises NotFound naming the first missing key."""
        ...

    async def get_ranges(self, key: str, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        """Slices (offset, size) of one blob, in order. Raises NotFound when
        the blob is missing, BackendError when a range passes its end."""
        ...

    async def missing(self, keys: Sequence[str]) -> set[str]:
        """Which of ``keys`` are not stored."""
        ...

    async def delete_many(self, keys: Sequence[str]) -> None:
        """Deletes blobs; missing keys are not an error."""
        ...

    async def list_keys(self, prefix: str = "") -> list[str]:
        """Every stored key under ``prefix``."""
        ...

    async def close(self) -> None:
        """Releases the store's threads or connections; no call may follow."""
        ...
