"""Image references as the engine reads them: which registry serves one, and
what a Docker config's ``auths`` key for that registry looks like."""

from __future__ import annotations

DOCKER_HUB = "docker.io"
_HUB_AUTH_KEYS = ("https://index.docker.io/v1/", "index.docker.io", "docker.io", "registry-1.docker.io")


def registry_of(reference: str) -> str:
    """The registry host (with port) serving ``reference``: its first path
    part when that has a dot, a colon or is "localhost", else Docker Hub."""
    first, sep, _ = reference.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost"):
        return first
    return DOCKER_HUB


def is_digest(reference: str) -> bool:
    """Whether ``reference`` pins a digest (``repo@sha256:...``)."""
    return "@" in reference


def auth_keys(registry: str) -> tuple[str, ...]:
    """The ``auths`` keys a Docker config may file ``registry``'s credentials under."""
    if registry == DOCKER_HUB:
        return _HUB_AUTH_KEYS
    return (
        registry,
        f"https://{registry}",
        f"http://{registry}",
        f"https://{registry}/v1/",
        f"https://{registry}/v2/",
    )


def normalize(reference: str) -> str:
    """``reference`` as the engine lists it: ``:latest`` added when it names
    neither a tag nor a digest."""
    if "@" in reference:
        return reference
    last = reference.rsplit("/", 1)[-1]
    return reference if ":" in last else f"{reference}:latest"
