"""The sandboxd RuntimeClass on the real kubelet node: the workspace is a
tmpfs mounted inside the container with the pool's file and byte limits, so
the kernel refuses the file past max_files and the byte past disk_bytes
(FILE_LIMIT / DISK_FULL), the sandbox keeps answering, and a Pod of another
RuntimeClass is untouched. deploy/testcluster/node-up.sh configures the
handler (runc behind deploy/node/sandboxd-runc) and applies the RuntimeClass."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandboxd.app import build_app
from sandboxd.client import AsyncClient
from tests.kube.conftest import REAL_NODE_BACKEND, kube_settings, require_real_node
from tests.kube.test_exec import _real_image

pytestmark = [pytest.mark.kube, pytest.mark.kube_node, pytest.mark.timeout(240)]

MAX_FILES = 64
DISK_BYTES = 4 << 20


@pytest.mark.parametrize("workspace", ["emptydir", "memory"])
async def test_files_and_bytes_are_capped_by_the_kernel(
    tmp_path: Path, kubeconfig: str, namespace: str, workspace: str
) -> None:
    require_real_node()
    settings = kube_settings(
        tmp_path,
        kubeconfig,
        namespace,
        backend={**REAL_NODE_BACKEND, "runtime_class": "sandboxd", "workspace": workspace},
        **{"limits.memory_bytes": 256 << 20, "limits.cpu_millis": 500},
    )
    app = build_app(settings)
    await app.start()
    try:
        async with AsyncClient(app.address) as client:
            await client.create_pool(
                "capped", _real_image(), min_ready=1, max_size=2,
                limits={"max_files": MAX_FILES, "disk_bytes": DISK_BYTES},
            )  # fmt: skip
            async with client.acquire("capped", timeout=120) as sb:
                mount = (await sb.exec("grep ' /workspace ' /proc/mounts")).text
                assert mount.startswith("tmpfs /workspace tmpfs") and f"nr_inodes={MAX_FILES}" in mount, mount
                # The node's wrapper makes the tmpfs its Pod's own user's.
                who = await sb.exec("id -u; touch /workspace/mine && stat -c %u /workspace")
                uid, owner = who.text.split()
                assert uid == owner != "1000"
                many = await sb.exec(f"for i in $(seq {2 * MAX_FILES}); do : > f$i || exit 28; done")
                assert many.exit_code == 28 and "No space left on device" in many.stderr.decode(), many
                assert many.outcome == "FILE_LIMIT", many
                count = int((await sb.exec("ls -A /workspace | wc -l")).text)
                assert MAX_FILES - 4 <= count < MAX_FILES, count
                assert (await sb.exec("rm -f f*")).ok
                fill = await sb.exec("head -c 8M /dev/zero > big")
                assert not fill.ok and "No space left on device" in fill.stderr.decode(), fill
                assert fill.outcome == "DISK_FULL", fill
                assert (await sb.exec("rm big && echo alive")).text == "alive\n"
            await client.delete_pool("capped", force=True)
    finally:
        await app.stop(grace=1)
