"""``sandboxd snapshot list|get|delete``: snapshots on a running server."""

from __future__ import annotations

import argparse
import json
from typing import Any

from google.protobuf.json_format import MessageToDict

from sandboxd.client import AsyncClient


def add_parser(sub: Any) -> None:
    """Adds ``sandboxd snapshot`` and its flags to the CLI's subcommands."""
    sp = sub.add_parser("snapshot", help="list, inspect or delete environment snapshots")
    sp.add_argument("action", choices=["list", "get", "delete"])
    sp.add_argument("snapshot_id", nargs="?", help="for get and delete")
    sp.add_argument("--target", default="127.0.0.1:50051")
    sp.add_argument("--token", help="tenant bearer token")
    sp.add_argument("--label", action="append", default=[], metavar="K=V", help="list: labels to match")
    sp.add_argument("--pool", default="", help="list: only this pool's snapshots")
    sp.add_argument("--parent", default="", help="list: only children of this snapshot")


async def run(args: argparse.Namespace) -> int:
    """Runs one snapshot action on the server; returns the exit status (2 when the id is missing)."""
    async with AsyncClient(args.target, token=args.token) as client:
        if args.action == "list":
            labels = dict(item.split("=", 1) for item in args.label)
            snaps = await client.list_snapshots(labels=labels, pool=args.pool, parent_id=args.parent)
            for s in snaps:
                chain = " <- ".join(f"{c.id}@v{c.policy_version}" if c.HasField("policy_version") else c.id
                                    for c in reversed(s.chain))  # fmt: skip
                print(f"{s.id}  pool={s.pool}  size={s.size_bytes}  entries={s.entry_count}  {chain}")
            return 0
        if not args.snapshot_id:
            print(f"sandboxd snapshot {args.action}: a snapshot id is required")
            return 2
        if args.action == "get":
            snap = await client.get_snapshot(args.snapshot_id)
            print(json.dumps(MessageToDict(snap, preserving_proto_field_name=True), indent=2))
            return 0
        await client.delete_snapshot(args.snapshot_id)
        print(f"deleted {args.snapshot_id}")
        return 0
