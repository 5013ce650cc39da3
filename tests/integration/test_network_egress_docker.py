"""Egress policies enforced on the host: a sandbox's only peer is its proxy.

Everything runs on this machine: an upstream network namespace made here
serves a package index with a real wheel, a git repository and an HTTPS server
with a test CA; the sandbox is a namespace made here, then a real container.
Unchanged pip, curl and git reach what the policy allows; every way around it
fails at once (refused, unreachable, 403, cut handshake), never by a timeout.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime
import hashlib
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import zipfile
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import docker
import pytest

from sandboxd.app import build_app
from sandboxd.backends.network import netns
from sandboxd.backends.network.egress import PROXY_URL, SandboxEgress, command_env, open_egress
from sandboxd.backends.network.policy import EgressPolicy
from sandboxd.backends.network.proxy import EgressLimits
from sandboxd.client import AsyncClient
from sandboxd.errors import FailedPrecondition, InvalidArgument
from tests.integration.conftest import make_settings, poll, running_app

pytestmark = [
    pytest.mark.docker,
    pytest.mark.skipif(os.geteuid() != 0 or bool(netns.missing_tools()), reason="needs root and iproute2"),
]

HERE = Path(__file__).parent
POLICY = ["pypi.test", "secure.test:443", "loop.test", "hostlocal.test"]


@dataclass(frozen=True)
class Upstream:
    address: str
    root: Path
    ca: Path
    host_end: str
    """This host's own address on the link to the upstream namespace."""

    async def resolve(self, host: str, port: int) -> list[str]:
        table = {"loop.test": "127.0.0.1", "hostlocal.test": self.host_end}
        if host in ("pypi.test", "secure.test", "other.test", "evil.test"):
            return [self.address]
        if host in table:
            return [table[host]]
        raise OSError(f"{host}: unknown in this test")


def sh(
    *argv: str, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, env=env, check=False)


def must(*argv: str) -> None:
    done = sh(*argv)
    assert done.returncode == 0, f"{argv}: {done.stderr}"


def build_wheel(directory: Path) -> Path:
    """A real, installable wheel of a one-module package."""
    name, version = "tinypkg", "0.1"
    dist = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": b"ANSWER = 42\n",
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = ""
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record += f"{path},sha256={digest},{len(data)}\n"
    record += f"{dist}/RECORD,,\n"
    wheel = directory / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for path, data in files.items():
            z.writestr(path, data)
        z.writestr(f"{dist}/RECORD", record)
    return wheel


def make_tls(directory: Path) -> tuple[Path, Path, Path]:
    x509 = pytest.importorskip("cryptography.x509")
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "egress test CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "secure.test")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("secure.test")]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    paths = directory / "ca.pem", directory / "cert.pem", directory / "key.pem"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return paths


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Upstream]:
    work = tmp_path_factory.mktemp("upstream")
    root = work / "www"
    (root / "simple" / "tinypkg").mkdir(parents=True)
    (root / "packages").mkdir()
    wheel = build_wheel(root / "packages")
    (root / "simple" / "tinypkg" / "index.html").write_text(
        f'<html><body><a href="../../packages/{wheel.name}">{wheel.name}</a></body></html>'
    )
    source = work / "source"
    source.mkdir()
    (source / "README").write_text("cloned through the proxy\n")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(source)]
    must("git", "init", "-q", str(source))
    must(*git, "add", "README")
    must(*git, "commit", "-qm", "one")
    must("git", "clone", "-q", "--bare", str(source), str(root / "repo.git"))
    must("git", "-C", str(root / "repo.git"), "update-server-info")
    ca, cert, key = make_tls(work)
    name = f"t31up{secrets.token_hex(3)}"
    octet = secrets.randbelow(250) + 1
    host_end, address = f"198.18.{octet}.1", f"198.18.{octet}.2"
    outer, inner = f"{name}h", f"{name}u"
    must("ip", "netns", "add", name)
    server: subprocess.Popen[str] | None = None
    try:
        must("ip", "link", "add", outer, "type", "veth", "peer", "name", inner)
        must("ip", "link", "set", inner, "netns", name)
        must("ip", "addr", "add", f"{host_end}/30", "dev", outer)
        must("ip", "link", "set", outer, "up")
        must("ip", "-n", name, "addr", "add", f"{address}/30", "dev", inner)
        must("ip", "-n", name, "link", "set", inner, "up")
        must("ip", "-n", name, "link", "set", "lo", "up")
        server = subprocess.Popen(
            [
                "ip",
                "netns",
                "exec",
                name,
                sys.executable,
                str(HERE / "egress_upstream.py"),
                address,
                str(root),
                str(cert),
                str(key),
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert server.stdout is not None and server.stdout.readline().strip() == "ready"
        yield Upstream(address, root, ca, host_end)
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=30)
        sh("ip", "netns", "del", name)


@pytest.fixture
def sandbox_ns() -> Iterator[str]:
    name = f"t31sb{secrets.token_hex(3)}"
    must("ip", "netns", "add", name)
    must("ip", "-n", name, "link", "set", "lo", "up")
    yield name
    sh("ip", "netns", "del", name)


@contextlib.asynccontextmanager
async def egress(
    target: str, upstream: Upstream, limits: EgressLimits | None = None
) -> AsyncIterator[SandboxEgress]:
    opened = await open_egress(
        f"sbx-{secrets.token_hex(4)}",
        target,
        EgressPolicy.parse(POLICY),
        resolve=upstream.resolve,
        limits=limits,
    )
    try:
        yield opened
    finally:
        await opened.close()
    assert opened.link.netns not in netns.leftover()


async def run_in(ns: str, *argv: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        "ip",
        "netns",
        "exec",
        ns,
        *argv,
        env={**os.environ, **(env or {})},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await proc.communicate()
    return proc.returncode or 0, out.decode(errors="replace")


EXPECTED_BYPASSES = {
    "egress_other_port": "ECONNREFUSED",
    "raw_ip_tcp": "ENETUNREACH",
    "proxy_less_https": "ENETUNREACH",
    "udp_elsewhere": "ENETUNREACH",
    "dns_other_resolver": "ENETUNREACH",
    "udp_egress_other_port": "ECONNREFUSED",
    "dns_denied": "rcode:3",
    "proxy_other_port": "HTTP/1.1 403 Forbidden",
    "proxy_raw_ip": "HTTP/1.1 403 Forbidden",
    "proxy_host_mismatch": "HTTP/1.1 403 Forbidden",
    "proxy_two_hosts": "HTTP/1.1 400 Bad Request",
    "connect_denied": "HTTP/1.1 403 Forbidden",
    "connect_other_port": "HTTP/1.1 403 Forbidden",
    "name_to_loopback": "HTTP/1.1 403 Forbidden",
    "name_to_host": "HTTP/1.1 403 Forbidden",
}


def check_probe(results: dict[str, str]) -> None:
    for probe, expected in EXPECTED_BYPASSES.items():
        assert results[probe] == expected, f"{probe}: {results[probe]} (expected {expected})"
    assert results["sni_mismatch"].startswith("cut:"), results["sni_mismatch"]
    assert results["sni_match"] == "tls:HTTP/1.0 200 OK", results["sni_match"]
    assert results["dns_allowed"] == f"A:{netns.EGRESS_ADDRESS}"


async def test_allowed_tools_work_and_every_bypass_fails(
    upstream: Upstream, sandbox_ns: str, tmp_path: Path
) -> None:
    env = {**command_env(), "PIP_DISABLE_PIP_VERSION_CHECK": "1", "GIT_TERMINAL_PROMPT": "0"}
    async with egress(sandbox_ns, upstream) as opened:
        rc, out = await run_in(
            sandbox_ns,
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-cache-dir",
            "--target",
            str(tmp_path / "t"),
            "--index-url",
            "http://pypi.test/simple/",
            "--trusted-host",
            "pypi.test",
            "tinypkg",
            env=env,
        )
        assert rc == 0, out
        assert (tmp_path / "t" / "tinypkg" / "__init__.py").read_text() == "ANSWER = 42\n"
        if shutil.which("curl"):
            rc, out = await run_in(
                sandbox_ns, "curl", "-sS", "--cacert", str(upstream.ca), "https://secure.test/", env=env
            )
            assert (rc, out) == (0, "hello over tls\n")
            rc, out = await run_in(
                sandbox_ns,
                "curl",
                "-sS",
                "-o",
                "/dev/null",
                "-w",
                "%{http_code}",
                "http://pypi.test:8080/",
                env=env,
            )
            assert out == "403", out
        rc, out = await run_in(
            sandbox_ns, "git", "clone", "-q", "http://pypi.test/repo.git", str(tmp_path / "r"), env=env
        )
        assert rc == 0, out
        assert (tmp_path / "r" / "README").read_text() == "cloned through the proxy\n"
        denied_before = opened.stats.denied
        rc, out = await run_in(sandbox_ns, sys.executable, str(HERE / "egress_probe.py"), upstream.address)
        assert rc == 0, out
        check_probe(json.loads(out))
        # Every attempt the proxy or resolver saw was counted (the others never left the sandbox).
        assert opened.stats.denied - denied_before == 10, list(opened.stats.recent_denials)
        assert any("other.test" in d for d in opened.stats.recent_denials)
        assert opened.stats.allowed >= 4 and opened.stats.bytes_in > 0


async def test_connections_at_once_are_bounded(upstream: Upstream, sandbox_ns: str) -> None:
    async with egress(sandbox_ns, upstream, EgressLimits(max_connections=1)) as opened:
        held = netns.in_netns(
            netns.NETNS_DIR / sandbox_ns, lambda: socket.create_connection(("169.254.77.1", 3128))
        )
        with held:
            reader, writer = await asyncio.open_connection(sock=held)
            writer.write(b"CONNECT secure.test:443 HTTP/1.1\r\n\r\n")
            assert (await reader.readline()).startswith(b"HTTP/1.1 200")
            _, out = await run_in(
                sandbox_ns,
                sys.executable,
                "-c",
                (
                    "import socket; s=socket.create_connection(('169.254.77.1',3128),timeout=5);"
                    "s.sendall(b'GET http://pypi.test/ HTTP/1.1\\r\\nHost: pypi.test\\r\\n\\r\\n');"
                    "print(s.recv(100).split(b'\\r\\n')[0].decode())"
                ),
            )
            assert out.strip() == "HTTP/1.1 429 Too Many Requests", out
            writer.close()
        assert any("connections open at once" in d for d in opened.stats.recent_denials)


async def test_a_real_container_reaches_only_its_proxy(
    upstream: Upstream, image: str, engine: docker.DockerClient
) -> None:
    container = await asyncio.to_thread(
        engine.containers.run,
        image,
        ["sleep", "infinity"],
        detach=True,
        network_mode="none",
        cap_drop=["ALL"],
        security_opt=["no-new-privileges"],
        user="1000:1000",
        tmpfs={"/tmp": "rw"},
        labels={"sandboxd.test": "egress"},
    )
    try:
        await asyncio.to_thread(container.reload)
        pid = str(container.attrs["State"]["Pid"])
        env = command_env()
        probe = (HERE / "egress_probe.py").read_text()

        def docker_exec(*argv: str) -> tuple[int, str]:
            code, out = container.exec_run(list(argv), environment=env)
            return code, out.decode(errors="replace")

        async with egress(pid, upstream) as opened:
            code, out = await asyncio.to_thread(
                docker_exec,
                "python3",
                "-c",
                "import urllib.request;print(urllib.request.urlopen('http://pypi.test/simple/tinypkg/').read().decode())",
            )
            assert code == 0 and "tinypkg-0.1-py3-none-any.whl" in out, out
            code, out = await asyncio.to_thread(
                docker_exec, "git", "clone", "-q", "http://pypi.test/repo.git", "/tmp/r"
            )
            assert code == 0, out
            code, out = await asyncio.to_thread(docker_exec, "cat", "/tmp/r/README")
            assert out == "cloned through the proxy\n"
            code, out = await asyncio.to_thread(docker_exec, "python3", "-c", probe, upstream.address)
            assert code == 0, out
            check_probe(json.loads(out))
            assert opened.stats.denied == 10
        # Closed: the sandbox's link went with the egress namespace.
        code, out = await asyncio.to_thread(docker_exec, "python3", "-c", probe, upstream.address)
        assert json.loads(out)["proxy_raw_ip"] == "ENETUNREACH"
        assert PROXY_URL.startswith("http://169.254.77.1")
    finally:
        await asyncio.to_thread(container.remove, force=True)


async def test_a_pool_with_a_policy_serves_it_to_its_sandboxes(
    upstream: Upstream, image: str, engine: docker.DockerClient, tmp_path: Path
) -> None:
    hosts = {
        "pypi.test": upstream.address,
        "secure.test": upstream.address,
        "loop.test": "127.0.0.1",
        "hostlocal.test": upstream.host_end,
    }
    settings = make_settings(tmp_path, **{"backend.egress_hosts": hosts})
    before = set(netns.leftover())
    async with running_app(settings, engine) as app, AsyncClient(app.address) as client:
        with pytest.raises(InvalidArgument, match=r"spec\.network.*'\*\.com'"):
            await client.create_pool("bad", image, network=["*.com"])
        with pytest.raises(FailedPrecondition, match="runc"):
            await client.create_pool("gv", image, runtime="gvisor", network=POLICY)
        await client.create_pool("net", image, max_size=2, network=POLICY)
        await client.create_pool("closed", image, max_size=1)
        assert list((await client.get_pool("net")).spec.network) == POLICY
        report = await client.preflight(concurrent=1, pool="net")
        assert report.ok and list(report.network) == POLICY, report
        probe = (HERE / "egress_probe.py").read_text()
        async with client.acquire("net") as sb, client.acquire("closed") as shut:
            fetch = "import urllib.request;print(urllib.request.urlopen('http://pypi.test/simple/tinypkg/').read())"
            result = await sb.exec(["python3", "-c", fetch])
            assert result.exit_code == 0 and "tinypkg-0.1" in result.text, result.text
            result = await sb.exec(["python3", "-c", probe, upstream.address])
            check_probe(json.loads(result.text))
            # Names resolve through the egress resolver: allowed ones to the proxy, others not at all.
            lookup = (
                "import socket,sys\ntry: print(socket.gethostbyname(sys.argv[1]))\n"
                "except OSError: print('none')"
            )
            assert (await sb.exec(["python3", "-c", lookup, "pypi.test"])).text == f"{netns.EGRESS_ADDRESS}\n"
            assert (await sb.exec(["python3", "-c", lookup, "evil.test"])).text == "none\n"
            assert len(set(netns.leftover()) - before) == 1
            # A pool without rules has no network at all, and no proxy settings.
            result = await shut.exec(["python3", "-c", probe, upstream.address])
            closed = json.loads(result.text)
            assert {closed[k] for k in ("egress_other_port", "raw_ip_tcp", "dns_denied")} == {"ENETUNREACH"}
            assert "HTTP_PROXY" not in (await shut.exec(["env"])).text
        await client.delete_pool("net", force=True)
        await client.delete_pool("closed", force=True)
        await poll(lambda: not set(netns.leftover()) - before, what="the egress namespaces to go")


async def test_a_restarted_control_plane_links_its_adopted_sandboxes_again(
    upstream: Upstream, image: str, engine: docker.DockerClient, tmp_path: Path
) -> None:
    settings = make_settings(tmp_path, **{"backend.egress_hosts": {"pypi.test": upstream.address}})
    fetch = "import urllib.request;print(urllib.request.urlopen('http://pypi.test/simple/tinypkg/').status)"
    probe = (HERE / "egress_probe.py").read_text()
    before = set(netns.leftover())
    first = build_app(settings)
    await first.start()
    try:
        async with AsyncClient(first.address) as client:
            await client.create_pool("net", image, max_size=1, network=["pypi.test"])
            lease = await client.lease("net", lease_ttl=600, timeout=60)
            kept = lease.sandboxes[0]
            assert (await kept.exec(["python3", "-c", fetch])).text == "200\n"
    finally:
        await first.stop(grace=1)
    # Stopped: the sandbox lives on with no link at all (it fails closed).
    assert not set(netns.leftover()) - before
    container = await asyncio.to_thread(engine.containers.get, f"sandboxd-{kept.id}")
    _, out = await asyncio.to_thread(container.exec_run, ["python3", "-c", probe, upstream.address])
    assert json.loads(out)["egress_other_port"] == "ENETUNREACH", "with a link it would be refused"
    async with running_app(settings, engine) as app, AsyncClient(app.address) as client:
        result = await client.exec(kept.id, ["python3", "-c", probe, upstream.address])
        assert json.loads(result.text)["egress_other_port"] == "ECONNREFUSED", "linked again"
        result = await client.exec(kept.id, ["python3", "-c", fetch])
        assert result.text == "200\n", result.stderr
        await client.release(lease.id)
        await client.delete_pool("net", force=True)
        await poll(lambda: not set(netns.leftover()) - before, what="the egress namespace to go")
