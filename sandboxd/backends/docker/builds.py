"""Image builds on a Docker engine through its /build API: on BuildKit
(``version=2``, which the engine runs itself, with no client session and no
``buildx``) unless the engine says it has none, then on its classic builder.
BuildKit's trace becomes plain log lines (sandboxd.backends.docker.
buildkit_trace) and its failing step a BuildFailed.

Without a session BuildKit takes only what the request itself carries: the
context tar, the Dockerfile's path in it, build arguments, labels, the tag
and the network mode. Registry credentials it asks of a session only: the
request's X-Registry-Config serves the classic builder, and the image cache
pulls the bases that need credentials before the build. Secrets, SSH and
local cache imports need a session, and are not offered here."""

from __future__ import annotations

import base64
import contextlib
import io
import json
import re
import tarfile
import uuid
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import requests
from docker.utils.json_stream import json_stream

from sandboxd.backends.base import BuildSpec, RegistryAuth
from sandboxd.backends.docker.buildkit_trace import TAIL_LINES, TRACE_ID, Trace, TraceError, decode_status
from sandboxd.errors import BuildFailed, TransientBackendError

BUILDKIT = "BuildKit"
CLASSIC = "classic"
# What an engine without BuildKit answers a version=2 build (Windows engines,
# engines whose BuildKit failed to start).
_NO_BUILDKIT = ("buildkit not supported", "buildkit is not supported", "unsupported builder version")
# BuildKit asks the client's session for registry credentials; a build
# through the API has none, so a registry asking for them answers this.
_NO_SESSION = "no active sessions"
_NO_SESSION_HINT = (
    " (the registry asks for credentials, which the engine's BuildKit takes only from a client"
    " session: with the registry's credentials in the Docker config, sandboxd pulls such a base"
    " before the build)"
)
# The Dockerfile frontend's parse errors name a line, not a vertex.
_PARSE_LINE = re.compile(r"dockerfile parse error line (\d+)", re.IGNORECASE)


@dataclass(frozen=True)
class Builder:
    """The builder an engine runs builds on, and whether its RUN steps get the default bridge."""

    name: str
    why: str
    network_none: bool = False

    def describe(self) -> str:
        """The build log's first line: which builder ran and why."""
        return f"builder: {self.name} ({self.why})"


def builder_of(headers: Mapping[str, str], has_bridge: bool) -> Builder:
    """The builder an engine with these /_ping headers runs. The engine sets
    ``Builder-Version`` only when its configuration names one (features.buildkit):
    "1" turns BuildKit off; absent, its API still builds on BuildKit when asked.
    On an engine without the default bridge network (dockerd --bridge=none)
    BuildKit's RUN steps need ``networkmode=none``: the classic builder gives
    them no network there either."""
    version = headers.get("Builder-Version", "")
    if headers.get("OSType", headers.get("Ostype", "")).lower() == "windows":
        return Builder(CLASSIC, "the engine runs Windows containers, which BuildKit does not build")
    if version == "1":
        return Builder(CLASSIC, "the engine's configuration turns BuildKit off (features.buildkit=false)")
    why = f"the engine's own, API {headers.get('Api-Version', '?')}"
    if not has_bridge:
        return Builder(BUILDKIT, why + "; RUN steps without network: the engine has no bridge", True)
    return Builder(BUILDKIT, why)


def context_tar(spec: BuildSpec) -> io.BytesIO:
    """The build context as the tar the engine takes. Blocking: run on a
    worker thread. BuildKit tells a context tar from a bare Dockerfile by
    reading one tar header from its first 1,024 bytes: so the GNU format
    (PAX would put an extended header, for fractional mtimes, before every
    entry) and first the top-level entry of the shortest name (a long name
    takes an extra header too)."""
    paths = sorted(spec.context.rglob("*"))
    top = min((p for p in paths if p.parent == spec.context), key=lambda p: len(p.name), default=None)
    if top is not None:
        paths.remove(top)
        paths.insert(0, top)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for path in paths:
            tar.add(path, arcname=str(path.relative_to(spec.context)), recursive=False)
    buf.seek(0)
    return buf


def registry_config(auths: Mapping[str, RegistryAuth]) -> str:
    """The X-Registry-Config header: every registry's credentials, base64url JSON by server."""
    config: dict[str, dict[str, str]] = {}
    for key, auth in auths.items():
        entry = {"username": auth.username, "password": auth.password, "serveraddress": auth.server or key}
        if auth.identity_token:
            entry["identitytoken"] = auth.identity_token
        config[key] = entry
    return base64.urlsafe_b64encode(json.dumps(config).encode()).decode()


def _dockerfile_line(spec: BuildSpec, number: int) -> str:
    try:
        lines = (spec.context / spec.dockerfile).read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return lines[number - 1].strip() if 0 < number <= len(lines) else ""


def _api_url(api: Any, path: str) -> str:
    return f"{api.base_url}/v{api.api_version}{path}"


class EngineBuild:
    """One build through /build on ``builder``, run on a worker thread by
    ``lines``; ``cancel`` (from any thread) asks the engine to stop it."""

    def __init__(self, api: Any, spec: BuildSpec, builder: Builder, context: io.BytesIO) -> None:
        self._api = api
        self._spec = spec
        self._builder = builder
        self._context = context
        self._id = uuid.uuid4().hex
        self._trace = Trace()
        self._tail: deque[str] = deque(maxlen=TAIL_LINES)
        self._step = ""  # the classic builder's latest "Step n/m : INSTRUCTION"

    def _params(self) -> dict[str, str]:
        params = {
            "version": "2" if self._builder.name == BUILDKIT else "1",
            "buildid": self._id,
            "t": self._spec.tag,
            "dockerfile": self._spec.dockerfile,
            "buildargs": json.dumps(dict(self._spec.build_args)),
            "labels": json.dumps(dict(self._spec.labels)),
            "rm": "1",
            "forcerm": "1",
        }
        if self._builder.network_none:
            params["networkmode"] = "none"
        return params

    def lines(self) -> Iterator[str]:
        """The build's log lines as the engine reports them; BuildFailed names
        the failing step, NoBuildKit when the engine turns BuildKit down."""
        headers = {"Content-Type": "application/x-tar"}
        if self._spec.registry_auths:
            headers["X-Registry-Config"] = registry_config(self._spec.registry_auths)
        response = self._api.post(
            _api_url(self._api, "/build"),
            params=self._params(),
            data=self._context,
            headers=headers,
            stream=True,
            timeout=None,
        )
        with response:
            if response.status_code >= 400:
                raise self._refused(response)
            for event in json_stream(response.iter_content(chunk_size=None)):
                yield from self._event(event)

    def _refused(self, response: requests.Response) -> Exception:
        try:
            message = str(response.json().get("message", "")) or response.text
        except ValueError:
            message = response.text
        if self._builder.name == BUILDKIT and any(word in message.lower() for word in _NO_BUILDKIT):
            return NoBuildKit(message)
        if response.status_code >= 500:
            return TransientBackendError(f"build of {self._spec.tag!r}: engine failed: {message}")
        return BuildFailed(f"build of {self._spec.tag!r} refused: {message}")

    def _event(self, event: dict[str, Any]) -> Iterator[str]:
        if event.get("error"):
            raise self._failed(str((event.get("errorDetail") or {}).get("message") or event["error"]))
        if event.get("id") == TRACE_ID and isinstance(event.get("aux"), str):
            try:
                status = decode_status(event["aux"])
            except TraceError as e:
                yield f"(a build trace message could not be read: {e})"
                return
            for line in self._trace.lines(status):
                self._tail.append(line)
                yield line
            return
        for line in str(event.get("stream", "") or event.get("status", "")).splitlines():
            if not line.strip():
                continue
            if line.startswith("Step ") and " : " in line:
                self._step = line.split(" : ", 1)[1]
            self._tail.append(line)
            yield line

    def _failed(self, message: str) -> BuildFailed:
        failure = self._trace.failure
        if failure is not None:
            hint = _NO_SESSION_HINT if _NO_SESSION in failure.error else ""
            return BuildFailed(
                f"build of {self._spec.tag!r} failed at {failure.step}: {failure.error}{hint}",
                step=failure.step,
                log_tail="\n".join(failure.tail),
            )
        step = self._step
        parsed = _PARSE_LINE.search(message)
        if parsed:
            step = _dockerfile_line(self._spec, int(parsed.group(1)))
        return BuildFailed(
            f"build of {self._spec.tag!r} failed at {step or 'its start'}: {message}",
            step=step,
            log_tail="\n".join(self._tail),
        )

    def cancel(self) -> None:
        """Asks the engine to stop the build (its stream then ends); best effort:
        the classic builder stops when the stream is dropped."""
        with contextlib.suppress(requests.exceptions.RequestException):
            self._api.post(_api_url(self._api, "/build/cancel"), params={"id": self._id}, timeout=10)


class NoBuildKit(Exception):
    """The engine refused a BuildKit build: it has none after all."""
