"""Egress policies: what the proxy costs, how fast a denial comes, and whether every bypass is blocked.

    python -m benchmarks.network              # about a minute
    python -m benchmarks.network --requests 50

All on this machine, as root: an upstream network namespace made here serves
a package index (a few real wheels) over HTTP; a sandbox namespace made here
is given its egress (sandboxd.backends.network) with a policy allowing that
index. Measured, each beside the same from a host process straight to the
upstream:

- ``pip install`` of the wheels from the index (pip's own start-up included);
- ``--requests`` small HTTP GETs one after the other (a connection each, as
  through the proxy);
- ``proxy_overhead_ratio``: the proxied time of both over the direct time
  (pip's median; pip's own work dominates it, ``details.http_overhead_ratio``
  is the ratio of the small requests alone);
- ``denied_p99_ms``: p99 of the time to a 403 for a host no rule allows;
- ``bypasses_tried``/``bypasses_blocked``: ways around the policy (another
  port, a raw IP, UDP, DNS to another resolver, a Host or SNI mismatch, a
  proxy-less socket, ...) and how many failed as they must.

- ``gateway_overhead_p50_ms``: a chat completion against a fake
  OpenAI-compatible server through the sandbox's metered model gateway, less
  the same straight from the host (p50s, alternated; benchmarks.gateway_overhead).
- ``acquire_p50_ms`` / ``narrowed_acquire_p50_ms``: then, on Docker, warm
  acquires of a pool under the same rules without and with ``network``
  (taking turns), and the narrowing bypasses among those counted above: a
  lease narrowed to ``tls.bench:443`` tries ``index.bench`` by CONNECT, by
  Host, by DNS, and through a download opened before it was narrowed
  (benchmarks.network_narrowing).

Writes benchmarks/results/network.json; its last stdout line is that JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import functools
import hashlib
import http.server
import json
import os
import secrets
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from benchmarks.egress_probes import NXDOMAIN, dns_rcode, proxy_says
from benchmarks.gateway_overhead import compare, route_for
from benchmarks.network_narrowing import measure_narrowing
from sandboxd.backends.network import netns
from sandboxd.backends.network.egress import PROXY_URL, command_env, open_egress
from sandboxd.backends.network.policy import EgressPolicy
from tests.fake_model import fake_model

RESULTS_PATH = Path(__file__).resolve().parent / "results" / "network.json"
WHEELS = ("alpha", "beta", "gamma")
POLICY = ["index.bench", "tls.bench:443"]


def run(*argv: str, env: dict[str, str] | None = None) -> None:
    done = subprocess.run(list(argv), capture_output=True, text=True, env=env, timeout=120, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {done.stderr.strip()[-500:]}")


def wheel(directory: Path, name: str) -> Path:
    dist = f"{name}-1.0.dist-info"
    files = {
        f"{name}/__init__.py": b"VALUE = 1\n" + b"#" * 20000 + b"\n",
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n".encode(),
        f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: bench\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(
        f"{p},sha256={base64.urlsafe_b64encode(hashlib.sha256(d).digest()).rstrip(b'=').decode()},{len(d)}\n"
        for p, d in files.items()
    )
    path = directory / f"{name}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for p, d in files.items():
            z.writestr(p, d)
        z.writestr(f"{dist}/RECORD", record + f"{dist}/RECORD,,\n")
    return path


def index(root: Path) -> None:
    (root / "packages").mkdir(parents=True)
    for name in WHEELS:
        made = wheel(root / "packages", name)
        page = root / "simple" / name
        page.mkdir(parents=True)
        (page / "index.html").write_text(f'<a href="../../packages/{made.name}">{made.name}</a>')
    (root / "small").write_bytes(b"x" * 512)


class Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args: Any) -> None:
        pass


class QuietServer(http.server.ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        # A download the proxy cuts (a narrowed lease's held connection) ends in a reset here.
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


def serve_in(ns: str, address: str, ports: Sequence[int], root: Path) -> list[http.server.HTTPServer]:
    """HTTP servers on sockets made in namespace ``ns``, served by threads of this process."""
    servers: list[http.server.HTTPServer] = []
    for port in ports:
        server = QuietServer(
            (address, port), functools.partial(Quiet, directory=str(root)), bind_and_activate=False
        )
        sock = netns.in_netns(netns.NETNS_DIR / ns, lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM))
        server.socket.close()
        server.socket = sock
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((address, port))
        sock.listen(64)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
    return servers


def timed_gets(url: str, n: int, proxy: str | None) -> float:
    handler = urllib.request.ProxyHandler({"http": proxy} if proxy else {})
    opener = urllib.request.build_opener(handler)
    began = time.perf_counter()
    for _ in range(n):
        with opener.open(url, timeout=30) as response:
            response.read()
    return time.perf_counter() - began


def denied_latencies(n: int) -> list[float]:
    samples = []
    for _ in range(n):
        began = time.perf_counter()
        with socket.create_connection((netns.EGRESS_ADDRESS, netns.PROXY_PORT), timeout=10) as s:
            s.sendall(b"GET http://denied.bench/ HTTP/1.1\r\nHost: denied.bench\r\n\r\n")
            head = s.recv(64)
        samples.append(time.perf_counter() - began)
        assert head.startswith(b"HTTP/1.1 403"), head
    return samples


def bypasses(up: str) -> dict[str, bool]:
    """Each way around the policy, and whether it failed as it must (True = blocked)."""

    def refused_or_unreachable(address: tuple[str, int]) -> bool:
        try:
            socket.create_connection(address, timeout=5).close()
        except (ConnectionRefusedError, OSError) as e:
            return not isinstance(e, TimeoutError)
        return False

    def udp_blocked(address: tuple[str, int]) -> bool:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.settimeout(5)
            try:
                s.connect(address)
                s.send(b"\x00" * 12)
                s.recv(64)
            except TimeoutError:
                return False
            except OSError:
                return True
        return False

    def sni_cut() -> bool:
        with socket.create_connection((netns.EGRESS_ADDRESS, netns.PROXY_PORT), timeout=5) as s:
            s.sendall(b"CONNECT tls.bench:443 HTTP/1.1\r\nHost: tls.bench:443\r\n\r\n")
            if not s.recv(64).startswith(b"HTTP/1.1 200"):
                return False
            context = ssl.create_default_context()
            context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
            try:
                context.wrap_socket(s, server_hostname="elsewhere.bench").close()
            except (OSError, ssl.SSLError):
                return True
        return False

    return {
        "egress_other_port": refused_or_unreachable((netns.EGRESS_ADDRESS, 22)),
        "raw_ip": refused_or_unreachable((up, 80)),
        "proxy_less_https": refused_or_unreachable((up, 443)),
        "udp": udp_blocked((up, 9999)),
        "dns_other_resolver": udp_blocked((up, 53)),
        "dns_denied_name": dns_rcode("denied.bench") == NXDOMAIN,
        "proxy_other_port": proxy_says(
            b"GET http://index.bench:8080/ HTTP/1.1\r\nHost: index.bench:8080\r\n\r\n", 403
        ),
        "proxy_raw_ip": proxy_says(f"GET http://{up}/ HTTP/1.1\r\nHost: {up}\r\n\r\n".encode(), 403),
        "host_mismatch": proxy_says(b"GET http://index.bench/ HTTP/1.1\r\nHost: denied.bench\r\n\r\n", 403),
        "connect_denied": proxy_says(b"CONNECT denied.bench:443 HTTP/1.1\r\nHost: denied.bench\r\n\r\n", 403),
        "sni_mismatch": sni_cut(),
    }


async def measure(requests: int, work: Path, acquires: int) -> dict[str, Any]:
    tag = secrets.token_hex(3)
    up_ns, box_ns = f"bnup{tag}", f"bnsb{tag}"
    octet = secrets.randbelow(250) + 1
    host_end, up = f"198.18.{octet}.1", f"198.18.{octet}.2"
    root = work / "www"
    index(root)
    run("ip", "netns", "add", up_ns)
    run("ip", "netns", "add", box_ns)
    servers: list[http.server.HTTPServer] = []
    stack = contextlib.AsyncExitStack()
    try:
        run("ip", "link", "add", f"{up_ns}h", "type", "veth", "peer", "name", f"{up_ns}u")
        run("ip", "link", "set", f"{up_ns}u", "netns", up_ns)
        run("ip", "addr", "add", f"{host_end}/30", "dev", f"{up_ns}h")
        run("ip", "link", "set", f"{up_ns}h", "up")
        run("ip", "-n", up_ns, "addr", "add", f"{up}/30", "dev", f"{up_ns}u")
        run("ip", "-n", up_ns, "link", "set", f"{up_ns}u", "up")
        run("ip", "-n", up_ns, "link", "set", "lo", "up")
        run("ip", "-n", box_ns, "link", "set", "lo", "up")
        servers = serve_in(up_ns, up, (80, 8080, 443), root)

        async def resolve(host: str, port: int) -> list[str]:
            if host in ("index.bench", "tls.bench"):
                return [up]
            raise OSError(f"{host}: not known to this benchmark")

        model = await stack.enter_async_context(fake_model())
        route, key = route_for(f"bench-{tag}", model.url)
        egress = await open_egress(
            f"bench-{tag}", box_ns, EgressPolicy.parse(POLICY), resolve=resolve, model=route.gateway
        )
        try:
            in_box: Callable[[Callable[[], Any]], Any] = functools.partial(
                netns.in_netns, netns.NETNS_DIR / box_ns
            )

            async def pip(proxied: bool) -> float:
                target = Path(tempfile.mkdtemp(dir=work))
                env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_CACHE_DIR": "1"}
                host = "index.bench" if proxied else up
                argv = [
                    sys.executable,
                    "-m",
                    "pip",
                    "install",
                    "-q",
                    "--target",
                    str(target),
                    "--index-url",
                    f"http://{host}/simple/",
                    "--trusted-host",
                    host,
                    *WHEELS,
                ]
                if proxied:
                    env.update(command_env())
                    argv = ["ip", "netns", "exec", box_ns, *argv]
                began = time.perf_counter()
                proc = await asyncio.create_subprocess_exec(*argv, env=env, stderr=asyncio.subprocess.PIPE)
                _, err = await proc.communicate()
                if proc.returncode != 0:
                    raise RuntimeError(f"pip install failed: {err.decode()[-500:]}")
                return time.perf_counter() - began

            # Interleaved, so that both meet the same background load.
            pip_direct: list[float] = []
            pip_proxied: list[float] = []
            for _ in range(3):
                pip_direct.append(await pip(False))
                pip_proxied.append(await pip(True))
            http_direct = await asyncio.to_thread(timed_gets, f"http://{up}/small", requests, None)
            http_proxied = await asyncio.to_thread(
                in_box, lambda: timed_gets("http://index.bench/small", requests, PROXY_URL)
            )
            denied = await asyncio.to_thread(in_box, lambda: denied_latencies(requests))
            blocked = await asyncio.to_thread(in_box, lambda: bypasses(up))
            gateway = await asyncio.to_thread(compare, min(requests, 200), model.url, key, in_box)
            gateway["recorded"] = route.ledger.recorded
            stats = egress.stats
        finally:
            await egress.close()
            await route.gateway.close()
        # After the timings above, so that no container start falls on them.
        narrowing = await measure_narrowing(up, root, POLICY, acquires)
    finally:
        await stack.aclose()
        for server in servers:
            server.shutdown()
            server.server_close()
        for ns in (up_ns, box_ns):
            await asyncio.to_thread(
                subprocess.run, ["ip", "netns", "del", ns], check=False, capture_output=True
            )
    direct = statistics.median(pip_direct) + http_direct
    proxied = statistics.median(pip_proxied) + http_proxied
    denied_ms = sorted(d * 1000 for d in denied)
    blocked.update(narrowing["bypasses"])
    return {
        "proxy_overhead_ratio": round(proxied / direct, 3),
        "denied_p99_ms": round(denied_ms[min(len(denied_ms) - 1, int(0.99 * len(denied_ms)))], 3),
        "gateway_overhead_p50_ms": gateway["overhead_p50_ms"],
        "acquire_p50_ms": narrowing["acquire_p50_ms"],
        "narrowed_acquire_p50_ms": narrowing["narrowed_acquire_p50_ms"],
        "bypasses_blocked": sum(blocked.values()),
        "bypasses_tried": len(blocked),
        "details": {
            "pip_install_direct_s": [round(x, 3) for x in pip_direct],
            "pip_install_proxied_s": [round(x, 3) for x in pip_proxied],
            "http_requests": requests,
            "http_direct_s": round(http_direct, 3),
            "http_proxied_s": round(http_proxied, 3),
            "http_overhead_ratio": round(http_proxied / http_direct, 3),
            "denied_p50_ms": round(statistics.median(denied_ms), 3),
            "bypasses": blocked,
            "proxy_counts": {"allowed": stats.allowed, "denied": stats.denied},
            "gateway": gateway,
            "narrowing": narrowing["details"],
            "cpus": os.cpu_count(),
        },
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument(
        "--acquires", type=int, default=31, help="warm acquires of each kind, narrowed and not (p50s)"
    )
    parser.add_argument("--output", type=Path, default=RESULTS_PATH)
    args = parser.parse_args(argv)
    if os.geteuid() != 0 or netns.missing_tools():
        print("needs root and iproute2 (ip, nsenter, sysctl)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as work:
        result = asyncio.run(measure(args.requests, Path(work), args.acquires))
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    d, g = result["details"], result["details"]["gateway"]
    print(f"pip + {d['http_requests']} GETs: proxied/direct {result['proxy_overhead_ratio']}x")
    print(
        f"chat completion p50: direct {g['direct_p50_ms']} ms, through the gateway "
        f"{g['gateway_p50_ms']} ms (+{g['overhead_p50_ms']} ms, {g['chats']} each, {g['recorded']} recorded)"
    )
    print(
        f"warm acquire p50: {result['acquire_p50_ms']} ms, narrowed {result['narrowed_acquire_p50_ms']} ms; "
        f"bypasses blocked {result['bypasses_blocked']}/{result['bypasses_tried']}"
    )
    print(json.dumps(result, separators=(",", ":")))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
