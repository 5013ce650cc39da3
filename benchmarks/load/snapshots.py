"""Finding a snapshot RPC on a server that may not have one yet.

The server's reflection service lists its methods; the first unary method of
a ``sandboxd.*`` service whose name contains "Snapshot" and whose request has
a ``sandbox_id`` field is called with just that field set. No such method
(or UNIMPLEMENTED on the first call) means snapshots are skipped and the
report says so.
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


def discover(target: str, timeout: float = 10.0) -> tuple[SnapshotMethod | None, str]:
    """(the method, a note on what was found). Blocking: run it in a thread."""
    channel = grpc.insecure_channel(target)
    try:
        grpc.channel_ready_future(channel).result(timeout=timeout)
        db = ProtoReflectionDescriptorDatabase(channel)
        try:
            services = [s for s in db.get_services() if s.startswith("sandboxd.")]
        except grpc.RpcError as e:
            return None, f"server reflection unavailable ({e.code().name})"  # type: ignore[attr-defined]
        pool = descriptor_pool.DescriptorPool(db)
        for name in sorted(services):
            service = pool.FindServiceByName(name)
            for method in service.methods:
                if "Snapshot" not in method.name or method.client_streaming or method.server_streaming:
                    continue
                if "sandbox_id" not in method.input_type.fields_by_name:
                    continue
                request = message_factory.GetMessageClass(method.input_type)
                response = message_factory.GetMessageClass(method.output_type)
                path = f"/{service.full_name}/{method.name}"
                return SnapshotMethod(path, request, response.FromString), f"using {path}"
        return None, f"no snapshot RPC among {', '.join(sorted(services)) or 'no sandboxd services'}"
    finally:
        channel.close()


async def call(channel: grpc.aio.Channel, method: SnapshotMethod, sandbox_id: str, timeout: float) -> Any:
    stub = channel.unary_unary(
        method.path,
        request_serializer=lambda m: m.SerializeToString(),
        response_deserializer=method.response_from_bytes,
    )
    return await stub(method.request(sandbox_id=sandbox_id), timeout=timeout)
