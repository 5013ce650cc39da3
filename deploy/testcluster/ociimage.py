"""Writes a single-platform OCI image archive (for ``ctr images import``)
from a root-filesystem tar and optional further layers, without Docker or a
registry. Layers are stored uncompressed, so a layer's digest is the sha256 of
its tar and two images built on the same rootfs tar share that layer.

    python3 deploy/testcluster/ociimage.py ROOTFS.tar NAME:TAG OUT.tar [--entrypoint /pause]
        [--layer LAYER.tar ...] [--env KEY=VALUE ...] [--user UID:GID] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import tarfile
from pathlib import Path

DEFAULT_PATH = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


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
    p.add_argument("--layer", type=Path, action="append", default=[], help="a further layer (tar), in order")
    p.add_argument("--env", action="append", default=[], help="KEY=VALUE (PATH has a default)")
    p.add_argument("--user", default="")
    p.add_argument("--workdir", default="")
    args = p.parse_args()
    paths: list[Path] = [args.rootfs, *args.layer]
    layers = [_sha(path) for path in paths]
    has_path = any(e.startswith("PATH=") for e in args.env)
    env = [*([] if has_path else [DEFAULT_PATH]), *args.env]
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {
            "Env": env,
            **({"Entrypoint": args.entrypoint} if args.entrypoint else {}),
            **({"User": args.user} if args.user else {}),
            **({"WorkingDir": args.workdir} if args.workdir else {}),
        },
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{layer}" for layer in layers]},
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
                "size": path.stat().st_size,
            }
            for path, layer in zip(paths, layers, strict=True)
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
        for layer, path in dict(zip(layers, paths, strict=True)).items():
            tar.add(str(path), arcname=f"blobs/sha256/{layer}")


if __name__ == "__main__":
    main()
