"""Writes a single-platform OCI image archive (for ``ctr images import``)
from a root-filesystem tar, without Docker or a registry.

    python3 deploy/testcluster/ociimage.py ROOTFS.tar NAME:TAG OUT.tar [--entrypoint /pause]
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import tarfile
from pathlib import Path


def _sha(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("rootfs", type=Path)
    p.add_argument("name")
    p.add_argument("out", type=Path)
    p.add_argument("--entrypoint", nargs="*", default=[])
    args = p.parse_args()
    layer = _sha(args.rootfs)
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {
            "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
            **({"Entrypoint": args.entrypoint} if args.entrypoint else {}),
        },
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{layer}"]},
    }
    config_b = json.dumps(config).encode()
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "digest": "sha256:" + hashlib.sha256(config_b).hexdigest(),
            "size": len(config_b),
        },
        "layers": [
            {
                "mediaType": "application/vnd.oci.image.layer.v1.tar",
                "digest": f"sha256:{layer}",
                "size": args.rootfs.stat().st_size,
            }
        ],
    }
    manifest_b = json.dumps(manifest).encode()
    ref = args.name
    index = {
        "schemaVersion": 2,
        "manifests": [
            {
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "digest": "sha256:" + hashlib.sha256(manifest_b).hexdigest(),
                "size": len(manifest_b),
                "platform": {"architecture": "amd64", "os": "linux"},
                "annotations": {
                    "io.containerd.image.name": ref,
                    "org.opencontainers.image.ref.name": ref.rsplit(":", 1)[-1],
                },
            }
        ],
    }

    def add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
        info = tarfile.TarInfo(name)
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))

    with tarfile.open(args.out, "w") as tar:
        add(tar, "oci-layout", b'{"imageLayoutVersion": "1.0.0"}')
        add(tar, "index.json", json.dumps(index).encode())
        add(tar, f"blobs/sha256/{hashlib.sha256(config_b).hexdigest()}", config_b)
        add(tar, f"blobs/sha256/{hashlib.sha256(manifest_b).hexdigest()}", manifest_b)
        tar.add(str(args.rootfs), arcname=f"blobs/sha256/{layer}")


if __name__ == "__main__":
    main()
