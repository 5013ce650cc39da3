"""The files a template build's COPY steps upload: one archive per files
hash (the SDK hashes what it copies), kept in a directory of this server's
for as long as it runs, and the one-use links the SDK PUTs them to."""

from __future__ import annotations

import asyncio
import hashlib
import secrets
import shutil
import tempfile
from pathlib import Path

__all__ = ["UPLOAD_PATH", "Uploads"]

UPLOAD_PATH = "/e2b-uploads/{token}"
"""Where on this API's own address the SDK PUTs an archive."""


class Uploads:
    """The COPY steps' uploaded archives by API key and files hash: one
    key's archives are never another's (a key that uploaded first under a
    hash would otherwise choose what another key's build copies)."""

    def __init__(self) -> None:
        self._dir: Path | None = None
        self._tokens: dict[str, tuple[str, str]] = {}

    async def _root(self) -> Path:
        if self._dir is None:
            self._dir = Path(await asyncio.to_thread(tempfile.mkdtemp, prefix="sandboxd-e2b-files-"))
        return self._dir

    async def path(self, key: str, files_hash: str) -> Path:
        scope = hashlib.sha256(key.encode()).hexdigest()[:24]
        folder = await self._root() / scope
        await asyncio.to_thread(folder.mkdir, exist_ok=True)
        return folder / f"{files_hash}.tar"

    async def present(self, key: str, files_hash: str) -> bool:
        return await asyncio.to_thread((await self.path(key, files_hash)).is_file)

    def link(self, key: str, files_hash: str) -> str:
        """A one-use token for the upload's URL (the SDK's PUT carries no key)."""
        token = secrets.token_urlsafe(24)
        self._tokens[token] = (key, files_hash)
        return token

    def take(self, token: str) -> tuple[str, str] | None:
        """(key, files hash) the token was given for; None if unknown or used."""
        return self._tokens.pop(token, None)

    async def close(self) -> None:
        if self._dir is not None:
            await asyncio.to_thread(shutil.rmtree, self._dir, True)
