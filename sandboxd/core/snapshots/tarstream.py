"""A streaming tar reader for the snapshot path: members come out with their
content while the archive is still arriving, so hashing and storing overlap
with the transfer. Understands what GNU tar writes (ustar, GNU long names and
links, pax headers); refuses what a snapshot never needs (sparse files,
multi-volume archives). A member above ``inline_max`` comes out as a Body,
read from the archive as it is iterated, so no member is ever whole in
memory."""

from __future__ import annotations

import posixpath
from collections.abc import AsyncIterator
from dataclasses import dataclass

from sandboxd.errors import BackendError, InvalidArgument

REGULAR = frozenset(b"07\x00")
HARDLINK = ord("1")
SYMLINK = ord("2")
DIRECTORY = ord("5")
# Pax headers and GNU long names are read whole; none a tar writes for a
# workspace comes near this.
_MAX_META_BYTES = 1 << 20
_SKIP_BYTES = 1 << 20


@dataclass(frozen=True)
class Member:
    """One archive member's header."""

    name: str
    """Relative, normalised path ('./' stripped)."""
    type: int
    """The tar type flag as a byte value (ord('0'), ord('5')...)."""
    mode: int
    size: int
    linkname: str = ""

    @property
    def is_file(self) -> bool:
        """Whether it is a regular file (type '0', '7' or the old NUL), so carries content."""
        return self.type in REGULAR


class _Reader:
    def __init__(self, chunks: AsyncIterator[bytes]) -> None:
        self._it = aiter(chunks)
        self._buf = b""
        self._pos = 0
        self._eof = False

    async def read(self, n: int) -> bytes:
        end = self._pos + n
        if end <= len(self._buf):  # the usual case: one slice, no await
            out = self._buf[self._pos : end]
            self._pos = end
            return out
        parts = [self._buf[self._pos :]]
        have = len(parts[0])
        while have < n:
            if self._eof:
                raise InvalidArgument("tar", "archive ends in the middle of a member")
            try:
                chunk = await anext(self._it)
            except StopAsyncIteration:
                self._eof = True
                continue
            parts.append(chunk)
            have += len(chunk)
        self._buf = b"".join(parts)
        self._pos = n
        return self._buf[:n]

    async def skip(self, n: int) -> None:
        """Reads past ``n`` bytes a piece at a time."""
        while n > 0:
            step = min(n, _SKIP_BYTES)
            await self.read(step)
            n -= step

    async def drain(self) -> None:
        """Consumes the rest of the stream (the producer may need to finish)."""
        if not self._eof:
            async for _ in self._it:
                pass
            self._eof = True


class Body:
    """The content of a member above read_members' ``inline_max``: iterate
    it for pieces of at most ``chunk`` bytes, read from the archive as they
    are asked for, before asking for the next member (what is left unread
    then is skipped)."""

    def __init__(self, reader: _Reader, name: str, size: int, chunk: int) -> None:
        self._reader = reader
        self.name = name
        self.size = size
        self._chunk = chunk
        self._left = size

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._pieces()

    async def _pieces(self) -> AsyncIterator[bytes]:
        while self._left > 0:
            step = min(self._left, self._chunk)
            try:
                data = await self._reader.read(step)
            except InvalidArgument as e:
                raise BackendError(
                    f"the workspace's tar stream ended inside {self.name} "
                    f"({self.size - self._left} of its {self.size} bytes)"
                ) from e
            self._left -= step
            yield data

    async def finish(self) -> None:
        """Skips what the consumer did not read."""
        await self._reader.skip(self._left)
        self._left = 0


def _octal(field: bytes) -> int:
    if field and field[0] & 0x80:  # GNU base-256 for large numbers
        value = field[0] & 0x3F
        for b in field[1:]:
            value = value << 8 | b
        return value
    text = field.split(b"\x00", 1)[0].strip()
    try:
        return int(text, 8) if text else 0
    except ValueError as e:
        raise InvalidArgument("tar", f"bad number field {field[:20]!r}") from e


def _text(field: bytes) -> str:
    return field.split(b"\x00", 1)[0].decode("utf-8", "surrogateescape")


def _pax(data: bytes) -> dict[str, str]:
    out: dict[str, str] = {}
    pos = 0
    while pos < len(data):
        space = data.find(b" ", pos)
        if space < 0:
            break
        try:
            length = int(data[pos:space])
        except ValueError as e:
            raise InvalidArgument("tar", "bad pax header") from e
        if length <= 0:
            break
        record = data[space + 1 : pos + length - 1]
        key, _, value = record.partition(b"=")
        out[key.decode()] = value.decode("utf-8", "surrogateescape")
        pos += length
    return out


def _normalise(name: str) -> str:
    if name.startswith("./") and "/." not in name[1:] and "//" not in name and not name.endswith("/"):
        return name[2:]  # what tar -c writes for the paths we ask for: already normal
    norm = posixpath.normpath(name)
    return "" if norm in (".", "") else norm.removeprefix("./")


async def read_members(
    chunks: AsyncIterator[bytes], inline_max: int = 0, chunk: int = 1 << 20
) -> AsyncIterator[tuple[Member, bytes | Body]]:
    """Yields (member, content) for each member; content is empty for all but
    regular files, and a Body (pieces of at most ``chunk`` bytes) for a
    regular file above ``inline_max`` bytes (0: none is). Consumes the whole
    stream."""
    reader = _Reader(chunks)
    long_name: str | None = None
    long_link: str | None = None
    pax: dict[str, str] = {}
    while True:
        try:
            block = await reader.read(512)
        except InvalidArgument:
            return  # no end-of-archive blocks: a truncated but clean ending
        if block == bytes(512):
            await reader.drain()
            return
        type_flag = block[156]
        size = int(pax["size"]) if "size" in pax else _octal(block[124:136])
        padded = (size + 511) // 512 * 512
        if type_flag in (ord("x"), ord("g"), ord("L"), ord("K")):
            if size > _MAX_META_BYTES:
                raise InvalidArgument("tar", f"a {chr(type_flag)!r} header of {size} bytes")
            data = (await reader.read(padded))[:size]
            if type_flag == ord("x"):
                pax = _pax(data)
            elif type_flag == ord("L"):
                long_name = data.rstrip(b"\x00").decode("utf-8", "surrogateescape")
            elif type_flag == ord("K"):
                long_link = data.rstrip(b"\x00").decode("utf-8", "surrogateescape")
            continue
        if type_flag in (ord("S"), ord("M"), ord("V")):
            raise InvalidArgument("tar", f"unsupported tar member type {chr(type_flag)!r}")
        name = _text(block[0:100])
        if block[257:263] == b"ustar\x00":
            prefix = _text(block[345:500])
            if prefix:
                name = f"{prefix}/{name}"
        name = pax.get("path", long_name if long_name is not None else name)
        linkname = pax.get("linkpath", long_link if long_link is not None else _text(block[157:257]))
        long_name = long_link = None
        pax = {}
        has_data = type_flag in REGULAR
        content: bytes | Body = b""
        rel = _normalise(name)
        if has_data and inline_max and size > inline_max:
            body = Body(reader, rel or name, size, chunk)
            if rel:
                mode = _octal(block[100:108]) & 0o7777
                yield Member(rel, type_flag, mode, size, linkname), body
            await body.finish()
            await reader.skip(padded - size)
            continue
        if has_data:
            content = (await reader.read(padded))[:size] if size else b""
        elif size and type_flag not in (HARDLINK, SYMLINK, DIRECTORY):
            await reader.skip(padded)
        if not rel:
            continue
        if type_flag == HARDLINK:
            linkname = _normalise(linkname)
        member = Member(rel, type_flag, _octal(block[100:108]) & 0o7777, size if has_data else 0, linkname)
        yield member, content
