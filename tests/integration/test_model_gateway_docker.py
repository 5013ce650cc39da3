"""The metered model route on the real engine: agents in sandboxes call the run's
model through sandboxd's gateway, and the trainer gets what they generated.

A fake OpenAI-compatible server (tests.fake_model) listens on this host; the
sandboxes see only the gateway, at the fixed in-sandbox address, with their
lease's key. Inside a sandbox the unchanged ``openai`` package (this host's
own installation, uploaded: the image has none) and Python's own HTTP client
call it, streamed and not; the calls arrive on the trajectories the rollout
queue delivers. Keys of released or other leases are refused, and every way
to the model server around the gateway fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
from pathlib import Path

import docker
import pytest

from sandboxd.backends.network import netns
from sandboxd.backends.network.egress import MODEL_URL
from sandboxd.client import AsyncClient
from sandboxd.client.rollouts import RolloutClient, trajectory
from tests.fake_model import PROMPT_IDS, REPLY, REPLY_IDS, REPLY_LOGPROBS, fake_model
from tests.integration.conftest import instance_containers, make_settings, poll, running_app
from tests.integration.test_restart_docker import free_port, start_server

pytestmark = [
    pytest.mark.docker,
    pytest.mark.timeout(240),
    pytest.mark.skipif(os.geteuid() != 0 or bool(netns.missing_tools()), reason="needs root and iproute2"),
]

# What an agent in the sandbox runs: the openai package, with nothing but the environment sandboxd set.
OPENAI_AGENT = """
import json, openai
client = openai.OpenAI(max_retries=0)
whole = client.chat.completions.create(
    model="policy", messages=[{"role": "user", "content": "fix the bug"}], logprobs=True
)
stream = client.chat.completions.create(
    model="policy", messages=[{"role": "user", "content": "again"}], stream=True,
    stream_options={"include_usage": True}, logprobs=True,
)
streamed = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
print(json.dumps({"whole": whole.choices[0].message.content, "streamed": streamed}))
"""

# The same with Python's own HTTP client; argv: path, body, key (the environment's when "").
URLLIB_CALL = """
import json, os, sys, urllib.request, urllib.error
key = sys.argv[3] or os.environ.get("OPENAI_API_KEY", "")
request = urllib.request.Request(
    os.environ["OPENAI_BASE_URL"] + sys.argv[1], data=sys.argv[2].encode() or None,
    headers={"Authorization": "Bearer " + key, "Content-Type": "application/json"},
)
try:
    with urllib.request.urlopen(request, timeout=30) as answer:
        print(answer.status); print(answer.read().decode())
except urllib.error.HTTPError as e:
    print(e.code); print(e.read().decode())
"""

# Ways to the model server around the gateway; each prints how it failed.
BYPASS = """
import errno, json, socket, sys, urllib.request
port, host_address = int(sys.argv[1]), sys.argv[2]
out = {}
def connect(name, address, p):
    s = socket.socket()
    s.settimeout(10)
    try:
        s.connect((address, p)); out[name] = "connected"
    except OSError as e:
        out[name] = errno.errorcode.get(e.errno, str(e))
    finally:
        s.close()
connect("loopback", "127.0.0.1", port)
connect("egress_address", "169.254.77.1", port)
connect("host_address", host_address, port)
proxy = urllib.request.ProxyHandler({"http": "http://169.254.77.1:3128"})
try:
    urllib.request.build_opener(proxy).open(f"http://{host_address}:{port}/v1/models", timeout=10)
    out["through_proxy"] = "answered"
except urllib.error.HTTPError as e:
    out["through_proxy"] = e.code
except OSError as e:
    out["through_proxy"] = str(e)
print(json.dumps(out))
"""

CHAT = json.dumps({"model": "policy", "messages": [{"role": "user", "content": "hi"}], "logprobs": True})


def host_address() -> str:
    """This host's address on its default route (where a server on all addresses listens too)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(("192.0.2.1", 9))  # no packet is sent: this only picks the route
        return str(s.getsockname()[0])


def openai_site(directory: Path) -> Path:
    """This host's installed openai package and what it imports, as a directory to upload."""
    names = ["openai", "httpx", "httpcore", "h11", "anyio", "sniffio", "idna", "certifi", "distro", "jiter"]
    names += [
        "pydantic",
        "pydantic-core",
        "typing-extensions",
        "typing-inspection",
        "annotated-types",
        "tqdm",
    ]
    for name in names:
        dist = importlib.metadata.distribution(name)
        for f in dist.files or []:
            text = str(f)
            if ".dist-info" in text or "__pycache__" in text or text.startswith(".."):
                continue
            source = Path(str(dist.locate_file(f)))
            if source.is_file():
                (directory / text).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(source, directory / text)
    return directory


async def test_agents_in_sandboxes_reach_the_model_only_through_the_metered_gateway(
    image: str, engine: docker.DockerClient, tmp_path: Path
) -> None:
    site = openai_site(tmp_path / "site")
    async with (
        fake_model("0.0.0.0") as model,
        running_app(make_settings(tmp_path), engine) as app,
        AsyncClient(app.address) as client,
    ):
        port = int(model.url.rsplit(":", 1)[1].split("/")[0])
        endpoint = f"http://127.0.0.1:{port}/v1"
        await client.create_pool("agents", image, max_size=3, model_endpoint=endpoint)
        assert (await client.get_pool("agents")).spec.model_endpoint == endpoint
        rollouts = RolloutClient(client)
        await rollouts.configure("rl", batch_groups=1, group_size=2, pool="agents")
        (slot,) = await rollouts.request_slots("rl", 1)
        group = await client.lease("agents", n=2, lease_ttl=600, timeout=60)
        other = await client.lease("agents", lease_ttl=600, timeout=60)
        a, b = group.sandboxes
        (c,) = other.sandboxes
        await rollouts.report_progress("rl", slot.group_id, lease_ids=[group.id])

        env = (await a.exec("env")).text
        assert f"OPENAI_BASE_URL={MODEL_URL}\n" in env and "OPENAI_API_KEY=sbxk." in env
        key_c = (await c.exec('printf %s "$OPENAI_API_KEY"')).text

        # The unchanged openai package, inside the sandbox, whole and streamed.
        await a.upload_dir(site, "site")
        # Importing 15 MiB of packages from the workspace is slow on a loaded host: a generous timeout.
        result = await a.exec(
            ["python3", "-c", OPENAI_AGENT], env={"PYTHONPATH": "/workspace/site"}, timeout=300
        )
        assert result.exit_code == 0, result.stderr
        assert json.loads(result.text) == {"whole": "".join(REPLY), "streamed": "".join(REPLY)}
        result = await b.exec(
            ["python3", "-c", URLLIB_CALL, "/completions", '{"model":"policy","prompt":"x"}', ""]
        )
        assert result.text.startswith("200\n"), result.text
        assert all(s.authorization == "" for s in model.seen), "the lease's key never reaches the server"
        seen = len(model.seen)

        # Another lease's key, used in this group's sandbox, is refused and recorded nowhere.
        result = await a.exec(["python3", "-c", URLLIB_CALL, "/chat/completions", CHAT, key_c])
        assert result.text.startswith("403\n") and "not this sandbox's" in result.text, result.text
        result = await a.exec(["python3", "-c", URLLIB_CALL, "/models", "", "sk-made-up"])
        assert result.text.startswith("401\n"), result.text
        # Every way to the server around the gateway fails, at once.
        probe = json.loads((await a.exec(["python3", "-c", BYPASS, str(port), host_address()])).text)
        assert probe == {
            "loopback": "ECONNREFUSED",
            "egress_address": "ECONNREFUSED",
            "host_address": "ENETUNREACH",
            "through_proxy": 403,
        }, probe
        assert len(model.seen) == seen
        # The denied attempt is counted on that sandbox; the gateway's calls and tokens in all.
        metrics = {
            line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
            for line in app.telemetry.prometheus_text().splitlines()
            if line.startswith(("sandboxd_egress_", "sandboxd_model_"))
        }
        assert metrics[f'sandboxd_egress_denied_total{{pool="agents",sandbox="{a.id}"}}'] == 1, metrics
        assert metrics[f'sandboxd_egress_denied_total{{pool="agents",sandbox="{b.id}"}}'] == 0, metrics
        assert metrics["sandboxd_model_calls_total"] == 3
        assert metrics['sandboxd_model_tokens_total{kind="completion"}'] == 15

        # Released, a lease's key stops working at once (here tried from a sandbox still leased).
        await client.release(other.id)
        result = await a.exec(["python3", "-c", URLLIB_CALL, "/models", "", key_c])
        assert result.text.startswith("401\n") and f"lease {other.id} has ended" in result.text, result.text

        await rollouts.submit(
            "rl",
            slot.group_id,
            [trajectory("t-a", sandbox_id=a.id, reward=1.0), trajectory("t-b", sandbox_id=b.id, reward=0.0)],
        )
        await client.release(group.id)
        async for batch in rollouts.pull("rl", max_batches=1):
            got = {t.trajectory_id: t for t in batch.groups[0].trajectories}
            await rollouts.ack("rl", batch.batch_id)
        whole, streamed = got["t-a"].model_calls
        assert (whole.path, whole.stream, streamed.stream) == ("/chat/completions", False, True)
        for call in (whole, streamed):
            assert (call.lease_id, call.sandbox_id, call.status) == (group.id, a.id, 200)
            assert list(call.choices[0].token_ids) == REPLY_IDS
            assert list(call.choices[0].logprobs) == REPLY_LOGPROBS
            assert list(call.prompt_token_ids) == PROMPT_IDS
            assert (call.prompt_tokens, call.completion_tokens) == (3, 5)
        assert b"fix the bug" in whole.request and b"again" in streamed.request
        (completion,) = got["t-b"].model_calls
        assert completion.path == "/completions" and completion.choices[0].text == "".join(REPLY)
        await client.delete_pool("agents", force=True)


async def test_a_model_route_needs_a_backend_that_enforces_it(
    image: str, engine: docker.DockerClient, tmp_path: Path
) -> None:
    async with running_app(make_settings(tmp_path), engine) as app, AsyncClient(app.address) as client:
        from sandboxd.errors import FailedPrecondition, InvalidArgument

        with pytest.raises(InvalidArgument, match=r"spec\.model_endpoint"):
            await client.create_pool("bad", image, model_endpoint="ftp://model:8000/v1")
        with pytest.raises(InvalidArgument, match="credentials"):
            await client.create_pool("bad", image, model_endpoint="http://u:p@model:8000/v1")
        with pytest.raises(FailedPrecondition, match="runc"):
            await client.create_pool("gv", image, runtime="gvisor", model_endpoint="http://127.0.0.1:1/v1")


async def test_egress_left_by_a_killed_control_plane_is_swept_at_start_up(
    image: str, engine: docker.DockerClient, tmp_path: Path
) -> None:
    instance = "it-" + secrets.token_hex(4)
    port = free_port()
    box = f"sbxtestbox-{secrets.token_hex(3)}"
    proc = await start_server(instance, tmp_path, port)
    try:
        async with AsyncClient(f"127.0.0.1:{port}") as client:
            await client.create_pool("net", image, min_ready=2, max_size=2, network=["pypi.test"])
            await poll(lambda: len(netns.leftover(instance)) == 2, timeout=90, what="two linked sandboxes")
        made = set(netns.leftover(instance))
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
        # Killed: its proxies died with it, the namespaces and links stay until the next start.
        assert set(netns.leftover(instance)) == made
        # One more, as a killed attach leaves it: a namespace no sandbox owns.
        await asyncio.to_thread(subprocess.run, ["ip", "netns", "add", box], check=True, timeout=30)
        link = await asyncio.to_thread(netns.attach, "sb-gone", box, instance=instance)
        link.close()
        stray = link.netns
        proc = await start_server(instance, tmp_path, port)
        # The restarted one destroys the warm sandboxes it does not adopt and sweeps what they left.
        await poll(lambda: not set(netns.leftover(instance)) & (made | {stray}), timeout=90, what="the sweep")
        async with AsyncClient(f"127.0.0.1:{port}") as client:
            await poll(lambda: len(netns.leftover(instance)) == 2, timeout=90, what="the pool to re-warm")
            await client.delete_pool("net", force=True)
        await poll(
            lambda: not netns.leftover(instance), timeout=60, what=f"the egress namespaces to go: {made}"
        )
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 60) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        for c in await asyncio.to_thread(instance_containers, engine, instance):
            with contextlib.suppress(docker.errors.NotFound):
                await asyncio.to_thread(c.remove, force=True)
        await asyncio.to_thread(netns.sweep, instance, set(), links=True)
        await asyncio.to_thread(
            subprocess.run, ["ip", "netns", "del", box], capture_output=True, timeout=30, check=False
        )
