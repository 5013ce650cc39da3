"""How a backend isolates sandboxes beyond the defaults: the optional ports for
runtimes other than runc, egress allow-lists and the model route, a bounded
writable root, a host uid per sandbox, and root inside a sandbox without
capabilities.

Re-exported by sandboxd.backends.base, where the port is described."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Protocol, runtime_checkable

from sandboxd.backends.network.gateway import ModelGateway


@runtime_checkable
class IsolationRuntimes(Protocol):
    """Optional for a backend: it can run sandboxes under more than the
    default runtime (RUNC); a backend without it runs RUNC only."""

    async def runtimes(self) -> frozenset[str]:
        """The RUNTIMES the backend can start sandboxes under now. Raises
        BackendError when it cannot tell."""
        ...


@runtime_checkable
class EgressPolicies(Protocol):
    """Optional for a backend: it can enforce a sandbox's network allow-list
    (SandboxSpec.network); a backend without it refuses every policy."""

    def network_refusal(self, runtime: str) -> str | None:
        """Why sandboxes of ``runtime`` cannot have a network policy here; None when they can."""
        ...


@runtime_checkable
class EgressNarrowing(Protocol):
    """Optional for a backend with EgressPolicies: it can put one sandbox's
    egress under fewer rules than its pool's for the length of a lease
    (AcquireRequest.network); a backend without it refuses narrowing."""

    async def narrowing_refusal(self, runtime: str) -> str | None:
        """Why a lease of a pool of ``runtime`` (with network rules) cannot
        narrow them here; None when it can."""
        ...

    async def narrow_egress(self, handle: str, rules: tuple[str, ...]) -> None:
        """Serves the sandbox's egress under ``rules`` (already checked to lie
        within its pool's) from the moment this returns, cutting connections
        opened under the rules before; () = its pool's own rules again. A
        sandbox without egress open (it has no network at all) keeps none.
        BackendError when it cannot."""
        ...

    def expect_narrowed(self, rules: Mapping[str, tuple[str, ...]]) -> None:
        """Sandbox id -> the rules a previous run narrowed it to: a sandbox
        linked again after a restart is linked under these, never its pool's
        first. Replaces what was expected before ({} = nothing)."""
        ...


@runtime_checkable
class WritableRoots(Protocol):
    """Optional for a backend: it can give a sandbox a writable root
    filesystem whose writes are bounded apart from the workspace's, by the
    sandbox's disk_bytes and max_files (SandboxSpec.writable_root); a
    backend without it refuses a writable root."""

    async def root_refusal(self, runtime: str) -> str | None:
        """Why sandboxes of ``runtime`` cannot have a bounded writable root
        here; None when they can."""
        ...


@runtime_checkable
class ModelRoutes(Protocol):
    """Optional for a backend with EgressPolicies: it serves the model route
    (SandboxSpec.model_gateway) through the gateway the core hands it, and
    tells each sandbox's egress counts."""

    def use_model_gateway(self, gateway: ModelGateway) -> None:
        """The gateway sandboxes with the model route are served by."""
        ...

    def egress_counts(self) -> dict[str, tuple[int, int]]:
        """(allowed, denied) attempts of each sandbox with egress open, by sandbox id."""
        ...

    def model_route_refusal(self, runtime: str) -> str | None:
        """Why sandboxes of ``runtime`` cannot have the model route here; None when they can."""
        ...

    def model_url(self) -> str:
        """OPENAI_BASE_URL of commands in sandboxes with the model route."""
        ...


SANDBOX_UID = 1000
"""The sandbox user's uid (and gid) as a snapshot records it, whatever host
uid a backend gave that sandbox: a manifest names the sandbox's own user by
this number and root by 0, so it restores onto any sandbox, each with its own."""


@runtime_checkable
class SandboxUsers(Protocol):
    """Optional for a backend: it gives each sandbox a host uid and gid of its
    own (sandboxes then share no per-user kernel limit: inotify instances,
    queued signals, processes). Without it the sandbox user is SANDBOX_UID."""

    def sandbox_user(self, handle: str) -> tuple[int, int]:
        """(uid, gid) the sandbox's user has on the host and inside it."""
        ...


@runtime_checkable
class RootUser(Protocol):
    """Optional for a backend: it runs one-shot commands (``ExecSpec.user ==
    ROOT_USER``) and file transfers as uid 0 inside the sandbox's own
    namespaces, with the sandbox's (empty) capability set, read-only root,
    limits and network, so root owns what it creates and nothing more."""

    async def put_tar_as(self, handle: str, dest: str, chunks: AsyncIterator[bytes], user: str) -> None:
        """``put_tar`` run as ``user`` ("" or ROOT_USER)."""
        ...

    def get_tar_as(self, handle: str, base: str, paths: tuple[str, ...], user: str) -> AsyncIterator[bytes]:
        """``get_tar`` run as ``user`` ("" or ROOT_USER)."""
        ...
