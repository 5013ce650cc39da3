"""The server name a TLS ClientHello asks for (its SNI extension), read before any byte goes upstream."""

from __future__ import annotations

import asyncio

MAX_HELLO = 1 << 16
_HANDSHAKE = 22
_CLIENT_HELLO = 1
_SERVER_NAME = 0


class NotTls(ValueError):
    """What the client sent is not a well-formed TLS ClientHello."""


async def read_client_hello(reader: asyncio.StreamReader) -> tuple[bytes, str]:
    """The raw records holding the ClientHello (to forward unchanged) and its
    SNI host name ('' when it names none). A hello spread over several records
    is gathered; anything else raises NotTls."""
    raw = bytearray()
    body = bytearray()
    while True:
        try:
            header = await reader.readexactly(5)
        except asyncio.IncompleteReadError as e:
            raise NotTls("connection ended inside the TLS record header") from e
        if header[0] != _HANDSHAKE or header[1] != 3:
            raise NotTls("first bytes are not a TLS handshake record")
        length = int.from_bytes(header[3:5], "big")
        if length == 0 or len(raw) + 5 + length > MAX_HELLO:
            raise NotTls("TLS record length out of bounds")
        try:
            fragment = await reader.readexactly(length)
        except asyncio.IncompleteReadError as e:
            raise NotTls("connection ended inside a TLS record") from e
        raw += header + fragment
        body += fragment
        if len(body) >= 4:
            if body[0] != _CLIENT_HELLO:
                raise NotTls("first handshake message is not a ClientHello")
            need = 4 + int.from_bytes(body[1:4], "big")
            if len(body) >= need:
                return bytes(raw), server_name(bytes(body[4:need]))


def server_name(hello: bytes) -> str:
    """The host_name of a ClientHello body's server_name extension, lower case; '' if none."""
    try:
        pos = 2 + 32  # legacy_version, random
        pos += 1 + hello[pos]  # session id
        pos += 2 + int.from_bytes(hello[pos : pos + 2], "big")  # cipher suites
        pos += 1 + hello[pos]  # compression methods
        if pos == len(hello):
            return ""
        end = pos + 2 + int.from_bytes(hello[pos : pos + 2], "big")
        pos += 2
        if end > len(hello):
            raise NotTls("extensions run past the ClientHello")
        while pos + 4 <= end:
            kind = int.from_bytes(hello[pos : pos + 2], "big")
            size = int.from_bytes(hello[pos + 2 : pos + 4], "big")
            data = hello[pos + 4 : pos + 4 + size]
            pos += 4 + size
            if kind != _SERVER_NAME:
                continue
            at = 2
            while at + 3 <= len(data):
                name_type = data[at]
                name_len = int.from_bytes(data[at + 1 : at + 3], "big")
                name = data[at + 3 : at + 3 + name_len]
                at += 3 + name_len
                if name_type == 0:
                    return name.decode("ascii").lower().rstrip(".")
            raise NotTls("server_name extension without a host name")
        return ""
    except (IndexError, UnicodeDecodeError) as e:
        raise NotTls("malformed ClientHello") from e
