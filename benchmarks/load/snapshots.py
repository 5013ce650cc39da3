"""Finding a snapshot RPC on a server that may not have one yet.

The server's reflection service lists its methods; a unary method of a
``sandboxd.*`` service named ``Snapshot`` or ``CreateSnapshot`` (or, failing
that, any name containing "Snapshot") whose request has a ``sandbox_id``
field is the one. It is called with ``sandbox_id`` and, where the request has
them, ``session``, ``turn``, ``labels`` and ``ttl_seconds`` (so snapshots of a
run are labelled and expire). No such method (or UNIMPLEMENTED on the first
call) means snapshots are skipped, and the report says so.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc
import grpc.aio
from google.protobuf import descriptor_pool, message_factory
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase


@dataclass(frozen=True)
class SnapshotMethod:
    path: str
    """/package.Service/Method"""
    request: Callable[..., Any]
    response_from_bytes: Callable[[bytes], Any]
    fields: frozenset[str] = frozenset({"sandbox_id"})


def discover(target: str, timeout: float = 10.0) -> tuple[SnapshotMethod | None, str]:
    """(the method, a note on what was found). Blocking: run it in a thread."""
    channel = grpc.insecure_channel(target)
    try:
        grpc.channel_ready_future(channel).result(timeout=timeout)
        db = ProtoReflectionDescriptorDatabase(channel)
        try:
            services = [s for s in db.get_services() if s.startswith("sandboxd.")]
        except grpc.RpcError as e:
            return None, f"server reflection unavailable ({e.code().name})"
        pool = descriptor_pool.DescriptorPool(db)
        candidates = []
        for name in sorted(services):
            service = pool.FindServiceByName(name)
            for method in service.methods:
                if "Snapshot" not in method.name or method.client_streaming or method.server_streaming:
                    continue
                if "sandbox_id" not in method.input_type.fields_by_name:
                    continue
                rank = 0 if method.name in ("Snapshot", "CreateSnapshot") else 1
                candidates.append((rank, service.full_name, method))
        if not candidates:
            return None, "no snapshot RPC on the server: snapshots skipped"
        _, service_name, method = min(candidates, key=lambda c: c[:2])
        request = message_factory.GetMessageClass(method.input_type)
        response = message_factory.GetMessageClass(method.output_type)
        fields = frozenset(method.input_type.fields_by_name)
        path = f"/{service_name}/{method.name}"
        return SnapshotMethod(path, request, response.FromString, fields), f"using {path}"
    finally:
        channel.close()


def build_request(method: SnapshotMethod, sandbox_id: str, **optional: Any) -> Any:
    """The request with sandbox_id and those optional fields the request has."""
    message = method.request(sandbox_id=sandbox_id)
    for key, value in optional.items():
        if key not in method.fields or value is None:
            continue
        if isinstance(value, dict):
            getattr(message, key).update(value)
        else:
            setattr(message, key, value)
    return message


async def call(
    channel: grpc.aio.Channel, method: SnapshotMethod, sandbox_id: str, timeout: float, **optional: Any
) -> Any:
    stub = channel.unary_unary(
        method.path,
        request_serializer=lambda m: m.SerializeToString(),
        response_deserializer=method.response_from_bytes,
    )
    return await stub(build_request(method, sandbox_id, **optional), timeout=timeout)
