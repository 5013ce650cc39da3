"""The metered model route on Kubernetes: one gateway listener in the control
plane for every sandbox Pod of a pool with a model endpoint.

On Docker each sandbox has a listener of its own in its egress namespace; a
Pod has no such namespace, so the control plane serves the gateway
(sandboxd.backends.network.gateway) on one address (``model_gateway_listen``)
and tells each call's sandbox by its source address: the Pod of this control
plane that has it now, as the Pod watch (cache.PodCache) last saw it. A
source that is no such Pod (another namespace's Pod, a node, anyone else) is
answered 403 before any key is looked at; a key is then served only for the
sandbox it was issued to, as on Docker. That a Pod cannot take another's
address is the CNI's part, as it is for NetworkPolicy itself.

Pods reach the listener at the control plane's Service (``model_gateway_service``:
its cluster IP and the port named ``model-gateway``; the pool's NetworkPolicy
lets them reach the Service's Pods on its target port), or at a fixed
``model_gateway_address`` (an IP the NetworkPolicy allows as an ipBlock).
Commands see it as OPENAI_BASE_URL with their lease's key, as on Docker.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sandboxd.backends.kubernetes.cache import PodCache
from sandboxd.backends.kubernetes.client import KubeClient
from sandboxd.backends.kubernetes.services import read_service
from sandboxd.backends.network.gateway import Closer, ModelGateway
from sandboxd.errors import FailedPrecondition, InvalidArgument

if TYPE_CHECKING:
    from sandboxd.backends.kubernetes.pods import KubernetesOptions

__all__ = ["GatewayOptions", "GatewayTarget", "KubeGateway", "KubeModelRoutes", "parse_host_port"]

log = logging.getLogger(__name__)

PORT_NAME = "model-gateway"
"""The port of the control plane's Service that Pods reach the gateway on."""


def parse_host_port(field: str, text: str, *, literal_ip: bool) -> tuple[str, int]:
    """("HOST", PORT) of ``text``; INVALID_ARGUMENT naming ``field``. With
    ``literal_ip`` the host must be an IP address (Pods may have no DNS)."""
    host, sep, port_text = text.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise InvalidArgument(field, f"must be HOST:PORT, got {text[:200]!r}")
    if literal_ip:
        try:
            ipaddress.ip_address(host)
        except ValueError:
            raise InvalidArgument(field, f"must be an IP address and port, got {text[:200]!r}") from None
    return host, int(port_text)


@dataclass(frozen=True)
class GatewayOptions:
    """Where the control plane serves the gateway, and how Pods reach it."""

    listen: str
    """HOST:PORT of the listener ("0.0.0.0:8091"; port 0 = any free one)."""
    service: str = ""
    """The control plane's Service Pods reach it through ("" = ``address``)."""
    service_namespace: str = ""
    address: str = ""
    """IP:PORT Pods reach it at without a Service ("" = the listener's own,
    when it has a specific IP)."""

    def check(self) -> GatewayOptions:
        """Itself; INVALID_ARGUMENT naming the bad setting."""
        host, _ = parse_host_port("backend.model_gateway_listen", self.listen, literal_ip=True)
        if self.address:
            parse_host_port("backend.model_gateway_address", self.address, literal_ip=True)
        elif not self.service and ipaddress.ip_address(host).is_unspecified:
            raise InvalidArgument(
                "backend.model_gateway_address",
                f"the listener {self.listen} has no address a Pod can use: set model_gateway_service "
                "(the chart's Service) or model_gateway_address",
            )
        return self


@dataclass(frozen=True)
class GatewayTarget:
    """Where Pods send their calls, and what their NetworkPolicy allows for it."""

    address: str
    port: int
    peer: dict[str, Any]
    """The NetworkPolicy ``to`` entry of the listener's side."""
    peer_port: int
    """The port that entry is allowed on (a Service's target port: policies see Pods' own)."""

    @property
    def url(self) -> str:
        """OPENAI_BASE_URL of the sandboxes."""
        host = f"[{self.address}]" if ":" in self.address else self.address
        return f"http://{host}:{self.port}/v1"


class KubeGateway:
    """The control plane's listener for sandbox Pods' model calls."""

    def __init__(
        self, client: KubeClient, cache: PodCache, options: GatewayOptions, sandbox_of: Callable[[str], str]
    ) -> None:
        """``sandbox_of`` names the sandbox of a Pod (by name) of this control plane ("" = none)."""
        self._client = client
        self._cache = cache
        self._options = options.check()
        self._sandbox_of = sandbox_of
        self._lock = asyncio.Lock()
        self._stop: Closer | None = None
        self._bound: tuple[str, int] | None = None
        self.target: GatewayTarget | None = None
        """Known once started."""

    async def start(self, gateway: ModelGateway) -> GatewayTarget:
        """Opens the listener (once) and reads where Pods reach it."""
        async with self._lock:
            if self.target is not None:
                return self.target
            if self._stop is None:
                host, port = parse_host_port(
                    "backend.model_gateway_listen", self._options.listen, literal_ip=True
                )
                family = socket.AF_INET6 if ":" in host else socket.AF_INET
                sock = socket.socket(family, socket.SOCK_STREAM)
                try:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                    sock.bind((host, port))
                    sock.listen(1024)
                except OSError as e:
                    sock.close()
                    raise FailedPrecondition(
                        f"the model gateway cannot listen on {self._options.listen}: {e}"
                    ) from None
                self._bound = (host, int(sock.getsockname()[1]))
                self._stop = await gateway.serve_shared(sock, self.identify)
                log.info("model gateway for sandbox Pods listening on %s:%d", *self._bound)
            self.target = await self._target()
            return self.target

    async def _target(self) -> GatewayTarget:
        opts = self._options
        if opts.service:
            return await self._service_target()
        assert self._bound is not None
        host, port = (
            parse_host_port("backend.model_gateway_address", opts.address, literal_ip=True)
            if opts.address
            else self._bound
        )
        bits = 128 if ":" in host else 32
        return GatewayTarget(host, port, {"ipBlock": {"cidr": f"{host}/{bits}"}}, port)

    async def _service_target(self) -> GatewayTarget:
        opts = self._options
        svc = await read_service(
            self._client,
            opts.service_namespace,
            opts.service,
            what="the model gateway",
            enabled_by="modelGateway.enabled",
            ports=(PORT_NAME,),
        )
        port, pods_port = svc.ports[PORT_NAME]
        return GatewayTarget(svc.address, port, svc.peer(), pods_port)

    async def identify(self, address: str) -> str:
        """The sandbox whose Pod has ``address`` now ("" = none of this control plane's)."""
        with contextlib.suppress(ValueError):
            # An IPv4 peer on a dual-stack listener arrives as ::ffff:a.b.c.d.
            ip = ipaddress.ip_address(address)
            if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
                address = str(ip.ipv4_mapped)
        pod = self._cache.at(address)
        if pod is None or pod.phase != "Running":
            return ""
        return self._sandbox_of(pod.name)

    async def close(self) -> None:
        if self._stop is not None:
            await self._stop()
            self._stop = None
        self.target = None


class KubeModelRoutes:
    """The model route of KubernetesBackend (sandboxd.backends.isolation.ModelRoutes)."""

    _gateway: KubeGateway | None
    _model_gateway: ModelGateway | None

    def use_model_gateway(self, gateway: ModelGateway) -> None:
        """Sandbox Pods with the model route are served by ``gateway`` (its
        listener opens with the first such Pod, or the first listing)."""
        self._model_gateway = gateway

    _options: KubernetesOptions

    def model_route_refusal(self, runtime: str) -> str | None:
        """Why a pool with a model endpoint cannot be had here; None when it
        can (runc and gVisor alike: the gateway is outside the Pod)."""
        del runtime
        if self._gateway is None:
            return (
                "the model route on Kubernetes needs the control plane's gateway listener "
                "(modelGateway.enabled in the chart's values, backend.model_gateway_listen in sandboxd.toml)"
            )
        if not self._options.pool_specs_in_cluster:
            return (
                'the model route on Kubernetes needs backend.state = "cluster": a pool\'s NetworkPolicy '
                "is kept, and removed, with its spec in the API server"
            )
        return None

    async def model_target(self) -> GatewayTarget | None:
        """Where Pods reach the gateway, the listener opened first; None without one."""
        if self._gateway is None or self._model_gateway is None:
            return None
        return await self._gateway.start(self._model_gateway)

    def model_url(self) -> str:
        """OPENAI_BASE_URL of commands in sandboxes with the model route."""
        target = self._gateway.target if self._gateway is not None else None
        if target is None:
            raise FailedPrecondition("the model gateway has not started on this control plane")
        return target.url

    def egress_counts(self) -> dict[str, tuple[int, int]]:
        """None here: the chart's egress proxy counts the attempts of Pods with rules."""
        return {}
