"""Bookkeeping the registry (sandboxd.core.registry) and leasing
(sandboxd.core.leasing, sandboxd.core.leases) share about their records:

- ``BusyCounts``: the operations (commands, transfers, snapshots) running in
  each sandbox. Leasing counts them; the reaper spares a busy sandbox's
  lease, and the registry's pools never recycle a busy sandbox.
- ``Tombstones``: the ids of what ended recently (a sandbox gone, a lease
  released), the oldest forgotten past a bound, so that a lookup can say why
  a sandbox is gone and a retried Release is a no-op.
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from typing import Generic, TypeVar

T = TypeVar("T")


class BusyCounts(Mapping[str, int]):
    """Operations running per sandbox id (only sandboxes with some are keys)."""

    def __init__(self) -> None:
        self._counts: dict[str, int] = {}

    def __getitem__(self, sandbox_id: str) -> int:
        return self._counts[sandbox_id]

    def __iter__(self) -> Iterator[str]:
        return iter(self._counts)

    def __len__(self) -> int:
        return len(self._counts)

    def busy(self, sandbox_id: str) -> bool:
        """Whether an operation runs in the sandbox now."""
        return self._counts.get(sandbox_id, 0) > 0

    @contextlib.contextmanager
    def using(self, sandbox_id: str) -> Iterator[None]:
        """Counts one operation in the sandbox for the block."""
        self._counts[sandbox_id] = self._counts.get(sandbox_id, 0) + 1
        try:
            yield
        finally:
            left = self._counts[sandbox_id] - 1
            if left:
                self._counts[sandbox_id] = left
            else:
                del self._counts[sandbox_id]


class Tombstones(Generic[T]):
    """Ids of what ended recently, each with what to say of it, the oldest
    forgotten once more than ``bound`` are kept."""

    def __init__(self, bound: int) -> None:
        self._bound = bound
        self._ended: OrderedDict[str, T] = OrderedDict()

    def add(self, key: str, value: T) -> None:
        """Remembers ``key`` as ended (a key already remembered keeps its place)."""
        self._ended[key] = value
        while len(self._ended) > self._bound:
            self._ended.popitem(last=False)

    def get(self, key: str) -> T | None:
        """What was said of ``key``, or None if it is not remembered."""
        return self._ended.get(key)

    def __contains__(self, key: object) -> bool:
        return key in self._ended

    def __len__(self) -> int:
        return len(self._ended)
