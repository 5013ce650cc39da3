"""The blob-store port. Keys are opaque '/'-separated strings chosen by the
caller (the snapshot core uses content digests); values are immutable bytes.
Operations take batches so a store can amortise round trips (a thread hop for
the local directory, concurrent requests for S3). Every method raises only
sandboxd.errors types."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol


class BlobStore(Protocol):
    async def put_absent(self, blobs: Mapping[str, bytes]) -> int:
        """Stores the blobs whose keys are not present yet (atomically: a key
        is never visible with partial content); returns the bytes written."""
        ...

    async def put_parts(self, key: str, parts: Sequence[bytes]) -> int:
        """Stores one blob given as consecutive parts (a pack of many), unless
        present, without joining them first where the store can; returns
        the bytes written."""
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

    async def close(self) -> None: ...
