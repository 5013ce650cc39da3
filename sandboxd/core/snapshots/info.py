"""A snapshot's metadata as Get and List show it and the catalog stores it
(SnapshotInfo, JSON in its meta column), and the links of its lineage chain
(ChainRef)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class ChainRef:
    """One snapshot of a lineage chain, as a descendant records it."""

    id: str
    policy_version: int | None
    turn: int
    created_at: float


@dataclass
class SnapshotInfo:
    """A snapshot's metadata (what Get and List return); ``chain`` ends with itself."""

    id: str
    tenant: str
    pool: str
    image: str
    labels: dict[str, str]
    policy_version: int | None
    turn: int
    parent_id: str
    session: str
    cwd: str
    env: dict[str, str]
    size_bytes: int
    stored_bytes: int
    entry_count: int
    digest: str
    created_at: float
    expires_at: float
    chain: list[ChainRef] = field(default_factory=list)
    # A live snapshot (sandboxd.core.snapshots.live): its one blob is the
    # checkpoint image (digest and sizes are the image's, no manifest entries).
    live: bool = False
    memory_limit_bytes: int = 0
    not_carried: list[str] = field(default_factory=list)
    """Live snapshots: the processes the checkpoint did not carry (started
    by engine execs, not kept), as "args (pid N)"."""

    def ref(self) -> ChainRef:
        """This snapshot as a link of a descendant's chain."""
        return ChainRef(self.id, self.policy_version, self.turn, self.created_at)

    def to_json(self) -> str:
        """Compact JSON of every field, chain included, as the catalog's meta column stores it."""
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> SnapshotInfo:
        """The inverse of ``to_json``; meta from before chains were kept reads with an empty chain."""
        doc = json.loads(text)
        doc["chain"] = [ChainRef(**c) for c in doc.get("chain", [])]
        return cls(**doc)
