"""Registry credentials from a Docker config (``config.json``'s ``auths``), as
``docker login`` writes them. Credential helpers (``credsStore``) are not
run: a host that needs them logs in with ``docker login`` into a plain file."""

from __future__ import annotations

import base64
import binascii
import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sandboxd.backends.base import RegistryAuth
from sandboxd.backends.image_refs import auth_keys, registry_of
from sandboxd.errors import InvalidArgument

log = logging.getLogger(__name__)


def config_dir(setting: str, environ: Mapping[str, str]) -> Path:
    """Where the Docker config lives: the setting, else $DOCKER_CONFIG, else ~/.docker."""
    if setting:
        return Path(setting).expanduser()
    if environ.get("DOCKER_CONFIG"):
        return Path(environ["DOCKER_CONFIG"]).expanduser()
    return Path(os.path.expanduser("~")) / ".docker"


def read_auths(directory: Path) -> dict[str, RegistryAuth]:
    """Credentials by ``auths`` key from ``directory``/config.json; none when
    the file is absent. A file that is not valid JSON is InvalidArgument
    naming it: a pull would otherwise fail later for want of credentials."""
    path = directory / "config.json"
    try:
        data: Any = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        raise InvalidArgument("images.docker_config", f"cannot read {path}: {e}") from e
    out: dict[str, RegistryAuth] = {}
    auths = data.get("auths", {}) if isinstance(data, dict) else {}
    for key, entry in auths.items() if isinstance(auths, dict) else ():
        if not isinstance(entry, dict):
            continue
        username, password = str(entry.get("username", "")), str(entry.get("password", ""))
        if entry.get("auth"):
            try:
                username, _, password = base64.b64decode(entry["auth"]).decode().partition(":")
            except (binascii.Error, UnicodeDecodeError, ValueError):
                log.warning("Docker config %s: the auth of %s is not base64 user:password", path, key)
                continue
        out[key] = RegistryAuth(
            server=key,
            username=username,
            password=password,
            identity_token=str(entry.get("identitytoken", "")),
        )
    return out


class Credentials:
    """The credentials a pull of a reference sends, read afresh from the
    Docker config at each pull (a ``docker login`` takes effect without a restart)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def every(self) -> dict[str, RegistryAuth]:
        """Every registry's credentials, by ``auths`` key: what a build sends,
        as it cannot know beforehand which registries its bases come from."""
        return read_auths(self.directory)

    def for_reference(self, reference: str) -> RegistryAuth | None:
        """The credentials for the registry serving ``reference``, or None (anonymous)."""
        auths = read_auths(self.directory)
        registry = registry_of(reference)
        for key in auth_keys(registry):
            if key in auths:
                found = auths[key]
                return RegistryAuth(registry, found.username, found.password, found.identity_token)
        return None
