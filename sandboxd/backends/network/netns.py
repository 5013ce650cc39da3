"""A sandbox's one network link: a veth from its namespace to an egress namespace of its own.

The egress namespace holds the link's other end and nothing else; IP
forwarding is off there and IPv6 off on both ends, and the sandbox gets an
address on a /30 with no default route. Its only peer is therefore the
egress address, where only the sockets made here listen: a connection to any
other port is refused at once, any other address is unreachable at once.
Each sandbox has its own egress namespace, so no sandbox can reach the proxy
that serves another (and be judged by that one's policy).

Needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN) in the host's network namespace
and a sandbox whose network stack is the host kernel's (runc, not gVisor).
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import shutil
import socket
import subprocess
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from sandboxd.errors import FailedPrecondition

T = TypeVar("T")

EGRESS_ADDRESS = "169.254.77.1"
SANDBOX_ADDRESS = "169.254.77.2"
PREFIX = 30
PROXY_PORT = 3128
DNS_PORT = 53
MODEL_PORT = 80
"""The model gateway's port on EGRESS_ADDRESS (sandboxd.backends.network.gateway)."""
NETNS_DIR = Path("/run/netns")
NAME_PREFIX = "sbxnet-"
_CLONE_NEWNET = 0x40000000
_COMMAND_TIMEOUT = 30.0


@dataclass(frozen=True)
class Link:
    netns: str
    """Name of the egress namespace (under NETNS_DIR)."""
    proxy: socket.socket
    """Listening TCP socket on EGRESS_ADDRESS:PROXY_PORT, in the egress namespace."""
    dns: socket.socket
    """UDP socket on EGRESS_ADDRESS:DNS_PORT, in the egress namespace."""
    model: socket.socket | None = None
    """Listening TCP socket on EGRESS_ADDRESS:MODEL_PORT when the sandbox has the model route."""

    def close(self) -> None:
        """Closes the sockets (the namespace stays until ``detach``)."""
        for sock in (self.proxy, self.dns, self.model):
            if sock is not None:
                sock.close()


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def instance_tag(instance: str) -> str:
    """Five hex digits naming a control-plane instance in its namespaces and
    veths, so that one instance's sweep leaves another's on the same host alone."""
    return _digest(instance)[:5]


def egress_netns(sandbox_id: str, instance: str = "") -> str:
    """The egress namespace's name: the instance's tag, then the sandbox's."""
    return f"{NAME_PREFIX}{instance_tag(instance)}-{_digest(sandbox_id)[:12]}"


def missing_tools() -> list[str]:
    return [tool for tool in ("ip", "nsenter", "sysctl") if shutil.which(tool) is None]


def _run(argv: list[str]) -> None:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=_COMMAND_TIMEOUT, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise FailedPrecondition(f"network setup: {' '.join(argv)} failed: {e}") from e
    if done.returncode != 0:
        raise FailedPrecondition(
            f"network setup: {' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()[-400:]}"
        )


def in_netns(path: Path, fn: Callable[[], T]) -> T:
    """``fn()`` run on a thread of its own that first enters the network namespace at ``path``;
    sockets it makes stay in that namespace. The thread ends with ``fn``, so no
    other work ever runs in the namespace by mistake."""
    libc = ctypes.CDLL(None, use_errno=True)
    box: dict[str, object] = {}

    def body() -> None:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                if libc.setns(fd, _CLONE_NEWNET) != 0:
                    err = ctypes.get_errno()
                    raise OSError(err, f"setns {path}: {os.strerror(err)}")
            finally:
                os.close(fd)
            box["value"] = fn()
        except BaseException as e:  # carried to the caller's thread
            box["error"] = e

    thread = threading.Thread(target=body, name="netns-enter", daemon=True)
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box["value"]  # type: ignore[return-value]


def _tcp_listener(port: int) -> socket.socket:
    tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        tcp.bind((EGRESS_ADDRESS, port))
        tcp.listen(128)
    except BaseException:
        tcp.close()
        raise
    return tcp


def _listen(model: bool) -> tuple[socket.socket, socket.socket, socket.socket | None]:
    made: list[socket.socket] = []
    try:
        made.append(_tcp_listener(PROXY_PORT))
        udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        made.append(udp)
        udp.bind((EGRESS_ADDRESS, DNS_PORT))
        model_sock = _tcp_listener(MODEL_PORT) if model else None
    except BaseException:
        for sock in made:
            sock.close()
        raise
    return made[0], udp, model_sock


def attach(sandbox_id: str, target: str, *, model: bool = False, instance: str = "") -> Link:
    """Links the sandbox's network namespace (``target``: the pid of a process in it,
    or the name of a named namespace) to a new egress namespace and opens the
    egress sockets there (the model gateway's too with ``model``). Blocking."""
    missing = missing_tools()
    if missing:
        raise FailedPrecondition(f"network policies need {', '.join(missing)} on the host")
    name = egress_netns(sandbox_id, instance)
    # 15 characters at most in a link's name: the instance's tag and 6 of the sandbox's.
    suffix = instance_tag(instance) + name[-12:][:6]
    outer, inner = f"sbxe{suffix}", f"sbxs{suffix}"
    detach(name)
    _run(["ip", "netns", "add", name])
    try:
        hub = ["nsenter", f"--net={NETNS_DIR / name}"]
        box = ["nsenter", f"--net={_ns_path(target)}"]
        _run([*hub, "sysctl", "-qw", "net.ipv4.ip_forward=0", "net.ipv6.conf.all.disable_ipv6=1"])
        _run(["ip", "link", "add", outer, "type", "veth", "peer", "name", inner])
        _run(["ip", "link", "set", outer, "netns", name])
        _run(["ip", "link", "set", inner, "netns", target])
        _run(["ip", "-n", name, "addr", "add", f"{EGRESS_ADDRESS}/{PREFIX}", "dev", outer])
        _run(["ip", "-n", name, "link", "set", "lo", "up"])
        _run(["ip", "-n", name, "link", "set", outer, "up"])
        _run([*box, "sysctl", "-qw", f"net.ipv6.conf.{inner}.disable_ipv6=1"])
        _run([*box, "ip", "addr", "add", f"{SANDBOX_ADDRESS}/{PREFIX}", "dev", inner])
        _run([*box, "ip", "link", "set", inner, "up"])
        tcp, udp, model_sock = in_netns(NETNS_DIR / name, lambda: _listen(model))
    except BaseException:
        # The host-side end exists here only between its creation and its move.
        subprocess.run(
            ["ip", "link", "del", outer], capture_output=True, timeout=_COMMAND_TIMEOUT, check=False
        )
        detach(name)
        raise
    return Link(netns=name, proxy=tcp, dns=udp, model=model_sock)


def _ns_path(target: str) -> Path:
    return Path(f"/proc/{target}/ns/net") if target.isdigit() else NETNS_DIR / target


def detach(netns: str) -> None:
    """Removes an egress namespace; its veth pair, the sandbox's end included, goes with it. Blocking."""
    if (NETNS_DIR / netns).exists():
        _run(["ip", "netns", "del", netns])


def leftover(instance: str | None = None) -> list[str]:
    """Egress namespaces present on the host, of ``instance`` only unless None
    (a restarted control plane removes those of its gone sandboxes)."""
    if not NETNS_DIR.is_dir():
        return []
    prefix = NAME_PREFIX if instance is None else f"{NAME_PREFIX}{instance_tag(instance)}-"
    return sorted(p.name for p in NETNS_DIR.iterdir() if p.name.startswith(prefix))


def stray_links(instance: str) -> list[str]:
    """Egress veth ends in sandboxd's own namespace: made by an ``attach`` that
    was killed before it moved them (each lives there only for that moment). Blocking."""
    try:
        done = subprocess.run(
            ["ip", "-o", "link", "show"],
            capture_output=True,
            text=True,
            timeout=_COMMAND_TIMEOUT,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    names = []
    tag = instance_tag(instance)
    for line in done.stdout.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            name = parts[1].strip().split("@", 1)[0]
            if name.startswith((f"sbxe{tag}", f"sbxs{tag}")):
                names.append(name)
    return names


def sweep(instance: str, keep: set[str], *, links: bool) -> list[str]:
    """Removes ``instance``'s egress namespaces not in ``keep`` and, with
    ``links`` (no attach under way), its stray veth ends;
    returns what it removed. What a killed control plane left is gone after
    this: its proxies and resolvers died with it, their namespaces did not. Blocking."""
    removed = []
    for name in leftover(instance):
        if name not in keep:
            with contextlib.suppress(FailedPrecondition):
                detach(name)
                removed.append(name)
    for link in stray_links(instance) if links else []:
        done = subprocess.run(
            ["ip", "link", "del", link], capture_output=True, timeout=_COMMAND_TIMEOUT, check=False
        )
        if done.returncode == 0:
            removed.append(link)
    return removed
