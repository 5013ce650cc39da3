"""What a registry says about an image without pulling it: whether it has
it, and the bytes its layers take (compressed, as fetched), read from its
manifest over the registry API (v2 / OCI distribution), with basic or
token auth. Blocking (requests): run on a worker thread."""

from __future__ import annotations

import re
from typing import Any

import requests

from sandboxd.backends.base import RegistryAuth, RemoteImage
from sandboxd.backends.image_refs import DOCKER_HUB, registry_of
from sandboxd.errors import FailedPrecondition, Unavailable

_ACCEPT = ", ".join(
    [
        "application/vnd.oci.image.index.v1+json",
        "application/vnd.docker.distribution.manifest.list.v2+json",
        "application/vnd.oci.image.manifest.v1+json",
        "application/vnd.docker.distribution.manifest.v2+json",
    ]
)
_INDEX_TYPES = (
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
)
_TIMEOUT_SECONDS = 10.0
_CHALLENGE = re.compile(r'(\w+)="([^"]*)"')


def split(reference: str) -> tuple[str, str, str]:
    """(registry API host, repository, tag or digest) of ``reference``."""
    registry = registry_of(reference)
    rest = reference[len(registry) + 1 :] if reference.startswith(registry + "/") else reference
    if "@" in rest:
        repository, ref = rest.split("@", 1)
    else:
        head, _, last = rest.rpartition("/")
        name, _, tag = last.partition(":")
        repository, ref = (f"{head}/{name}" if head else name), (tag or "latest")
    if registry == DOCKER_HUB:
        return "registry-1.docker.io", repository if "/" in repository else f"library/{repository}", ref
    return registry, repository, ref


def _scheme(host: str) -> str:
    name = host.rsplit(":", 1)[0] if not host.startswith("[") else host
    # The engine speaks plain HTTP to loopback registries; so does this.
    return "http" if name.startswith("127.") or name in ("localhost", "[::1]") else "https"


class _Session:
    def __init__(self, host: str, repository: str, auth: RegistryAuth | None, reference: str) -> None:
        self.base = f"{_scheme(host)}://{host}/v2/{repository}"
        self.repository = repository
        self.auth = auth
        self.reference = reference
        self.http = requests.Session()
        self.header: dict[str, str] = {}
        self.challenged = False

    def get(self, path: str) -> requests.Response:
        url = f"{self.base}/{path}"
        try:
            answer = self.http.get(url, headers={"Accept": _ACCEPT, **self.header}, timeout=_TIMEOUT_SECONDS)
            if answer.status_code == 401 and not self.challenged:
                self.challenged = True
                self._authenticate(answer.headers.get("WWW-Authenticate", ""))
                answer = self.http.get(
                    url, headers={"Accept": _ACCEPT, **self.header}, timeout=_TIMEOUT_SECONDS
                )
        except requests.exceptions.RequestException as e:
            raise Unavailable(f"registry for image {self.reference!r} cannot be reached: {e}") from e
        if answer.status_code == 404:
            raise FailedPrecondition(f"registry has no image {self.reference!r} (manifest unknown)")
        if answer.status_code in (401, 403):
            raise FailedPrecondition(
                f"registry refused image {self.reference!r} ({answer.status_code}): "
                "credentials missing or wrong (the Docker config's auths, images.docker_config)"
            )
        if answer.status_code >= 500:
            raise Unavailable(f"registry for image {self.reference!r} answered {answer.status_code}")
        if answer.status_code >= 400:
            raise FailedPrecondition(f"registry refused image {self.reference!r}: {answer.status_code}")
        return answer

    def _authenticate(self, challenge: str) -> None:
        scheme, _, params = challenge.partition(" ")
        basic = (self.auth.username, self.auth.password) if self.auth and self.auth.username else None
        if scheme.lower() == "basic":
            self.http.auth = basic
            return
        fields = dict(_CHALLENGE.findall(params))
        if scheme.lower() != "bearer" or "realm" not in fields:
            return
        query = {
            "service": fields.get("service", ""),
            "scope": fields.get("scope", f"repository:{self.repository}:pull"),
        }
        try:
            answer = requests.get(fields["realm"], params=query, auth=basic, timeout=_TIMEOUT_SECONDS)
        except requests.exceptions.RequestException as e:
            raise Unavailable(f"token service for image {self.reference!r} cannot be reached: {e}") from e
        if answer.status_code >= 400:
            raise FailedPrecondition(
                f"registry refused a token for image {self.reference!r} ({answer.status_code})"
            )
        body: dict[str, Any] = answer.json()
        self.header = {"Authorization": f"Bearer {body.get('token') or body.get('access_token', '')}"}


def remote_image(reference: str, auth: RegistryAuth | None) -> RemoteImage:
    """The registry's facts on ``reference``; FailedPrecondition when it has
    no such image or refuses the credentials, Unavailable when it cannot be reached."""
    host, repository, ref = split(reference)
    session = _Session(host, repository, auth, reference)
    answer = session.get(f"manifests/{ref}")
    manifest: dict[str, Any] = answer.json()
    digest = answer.headers.get("Docker-Content-Digest", ref)
    if manifest.get("mediaType") in _INDEX_TYPES or "manifests" in manifest:
        entries = manifest.get("manifests") or []
        chosen = next(
            (
                m
                for m in entries
                if (m.get("platform") or {}).get("os") == "linux"
                and m["platform"].get("architecture") == "amd64"
            ),
            entries[0] if entries else None,
        )
        if chosen is None:
            raise FailedPrecondition(f"registry's index for image {reference!r} lists no image")
        digest = chosen["digest"]
        manifest = session.get(f"manifests/{digest}").json()
    layers = manifest.get("layers") or []
    size = sum(int(layer.get("size", 0)) for layer in layers) + int(
        (manifest.get("config") or {}).get("size", 0)
    )
    blobs = tuple((str(layer.get("digest", "")), int(layer.get("size", 0))) for layer in layers)
    return RemoteImage(reference, digest, size, blobs)
