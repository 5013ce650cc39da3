"""E2B template builds as Dockerfiles: the steps the SDK's template builder
sends (``TemplateBuildStartV2``: a base image or template, then COPY, RUN,
ENV, WORKDIR and USER steps, a start and a ready command) turned into a
Dockerfile whose context holds each COPY step's uploaded files under
``files/<files hash>/``, for sandboxd's own image builds.

Users keep sandboxd's model: a sandbox's commands run as root (uid 0 with no
capabilities) or as the sandbox's own user, whom images know as uid 1000.
So ``set_user("root")`` is ``USER root`` and any other name (E2B's default
``user`` included) is ``USER 1000:1000``, the build steps after it running as
uid 1000 whether or not the image names that uid; COPY's owners map the
same way. RUN steps run with no network: the engine builds without one.

Step names are E2B's: ``base`` for the base image, ``1``.. for the steps
in order (so the SDK points a failure at the builder call that made it),
``finalize`` for what follows them."""

from __future__ import annotations

import json
import posixpath
import re
from dataclasses import dataclass, field
from typing import Any

__all__ = ["BASE", "FINALIZE", "StepError", "Translated", "docker_user", "failed_step", "translate"]

BASE = "base"
FINALIZE = "finalize"
SANDBOX_UID = "1000"
_SHELL = ["/bin/sh", "-c"]
_MODE = re.compile(r"^0?[0-7]{3,4}$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_HASH = re.compile(r"^[A-Za-z0-9_-]{8,128}$")
_VERTEX = re.compile(r"^\[(?:[\w.-]+ )?(\d+)/(\d+)\]\s*(.*)$")


class StepError(ValueError):
    """A build input sandboxd cannot build, naming the step (E2B's name)."""

    def __init__(self, step: str, message: str) -> None:
        super().__init__(f"step {step}: {message}")
        self.step = step
        self.message = f"step {step}: {message}"


@dataclass
class Translated:
    """A build's Dockerfile, the uploads it needs and how to read its failures."""

    dockerfile: str
    copies: dict[str, str] = field(default_factory=dict)
    """files hash -> the step that copies it."""
    vertices: list[tuple[str, str]] = field(default_factory=list)
    """(E2B step, Dockerfile instruction) of each instruction BuildKit runs, in order."""
    user: str = ""
    workdir: str = ""
    start_cmd: str = ""
    ready_cmd: str = ""


def docker_user(user: str) -> str:
    """The Dockerfile user of an E2B user (``name`` or ``name:group``)."""
    name, _, group = user.partition(":")
    uid = "root" if name in ("root", "0") else SANDBOX_UID
    if not group:
        return uid if uid == "root" else f"{uid}:{uid}"
    return f"{uid}:{'root' if group in ('root', '0') else SANDBOX_UID}"


def _args(step: dict[str, Any], where: str, low: int, high: int) -> list[str]:
    args = step.get("args") or []
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise StepError(where, "args must be a list of strings")
    if not low <= len(args) <= high:
        raise StepError(where, f"takes {low} to {high} arguments, not {len(args)}")
    return args


def _env_value(value: str, where: str) -> str:
    if "\n" in value or "\r" in value:
        raise StepError(where, "an environment value cannot hold a line break")
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$") + '"'


def _copy(step: dict[str, Any], where: str, out: Translated) -> str:
    args = _args(step, where, 2, 4)
    src, dest = args[0], args[1]
    user = args[2] if len(args) > 2 else ""
    mode = args[3] if len(args) > 3 else ""
    files_hash = step.get("filesHash")
    if not isinstance(files_hash, str) or not _HASH.match(files_hash):
        raise StepError(where, "COPY needs the filesHash of its uploaded files")
    norm = posixpath.normpath(src)
    if not src or src.startswith("/") or norm == ".." or norm.startswith("../"):
        raise StepError(where, f"COPY source {src!r} must be a path inside the build's context")
    if not dest:
        raise StepError(where, "COPY needs a destination")
    if mode and not _MODE.match(mode):
        raise StepError(where, f"COPY mode {mode!r} must be octal permissions such as 0755")
    out.copies.setdefault(files_hash, where)
    flags = f"--chown={docker_user(user)} " if user else ""
    flags += f"--chmod={mode} " if mode else ""
    return f"COPY {flags}{json.dumps([f'files/{files_hash}/{norm}', dest])}"


def translate(spec: dict[str, Any], base_image: str) -> Translated:
    """The Dockerfile of a build whose base is ``base_image`` (the image of
    ``fromImage``, or of the template ``fromTemplate`` names). Raises
    StepError naming the step that cannot be built."""
    if spec.get("fromImageRegistry"):
        raise StepError(BASE, "registry credentials are not served: the engine pulls with its own")
    if not base_image or any(c.isspace() for c in base_image):
        raise StepError(BASE, "a base image (from_image) or template (from_template) is required")
    steps = spec.get("steps") or []
    if not isinstance(steps, list):
        raise StepError(BASE, "steps must be a list")
    out = Translated("")
    lines = [f"FROM {base_image}"]
    out.vertices.append((BASE, lines[0]))
    user = ""
    for index, step in enumerate(steps, start=1):
        where = str(index)
        if not isinstance(step, dict):
            raise StepError(where, "a step must be an object")
        kind = step.get("type")
        if kind == "RUN":
            args = _args(step, where, 1, 2)
            run = f"RUN {json.dumps([*_SHELL, args[0]])}"
            if len(args) == 2 and args[1]:
                lines.append(f"USER {docker_user(args[1])}")
                lines.append(run)
                lines.append(f"USER {user or 'root'}")
            else:
                lines.append(run)
            out.vertices.append((where, run))
        elif kind == "COPY":
            line = _copy(step, where, out)
            lines.append(line)
            out.vertices.append((where, line))
        elif kind == "ENV":
            args = _args(step, where, 2, 1 << 16)
            if len(args) % 2:
                raise StepError(where, "ENV takes name, value pairs")
            pairs = list(zip(args[::2], args[1::2], strict=True))
            for name, _ in pairs:
                if not _ENV_NAME.match(name):
                    raise StepError(where, f"{name!r} is not an environment variable name")
            lines.append("ENV " + " ".join(f"{n}={_env_value(v, where)}" for n, v in pairs))
        elif kind == "WORKDIR":
            (path,) = _args(step, where, 1, 1)
            if not path or "\n" in path:
                raise StepError(where, "WORKDIR needs a path")
            line = f"WORKDIR {json.dumps(path)[1:-1]}"
            lines.append(line)
            out.vertices.append((where, line))
            out.workdir = posixpath.join(out.workdir or "/", path)
        elif kind == "USER":
            (name,) = _args(step, where, 1, 1)
            if not name:
                raise StepError(where, "USER needs a user")
            user = docker_user(name)
            out.user = "root" if user == "root" else "user"
            lines.append(f"USER {user}")
        else:
            raise StepError(where, f"unknown step type {kind!r} (COPY, ENV, RUN, WORKDIR or USER)")
    for name in ("startCmd", "readyCmd"):
        value = spec.get(name) or ""
        if not isinstance(value, str):
            raise StepError(FINALIZE, f"{name} must be a string")
    out.start_cmd, out.ready_cmd = spec.get("startCmd") or "", spec.get("readyCmd") or ""
    out.dockerfile = "\n".join(lines) + "\n"
    return out


def _display(line: str) -> str:
    """An instruction as BuildKit names it: exec-form arguments joined."""
    word, _, rest = line.partition(" ")
    flags = []
    while rest.startswith("--"):
        flag, _, rest = rest.partition(" ")
        flags.append(flag)
    if rest.startswith("["):
        rest = " ".join(json.loads(rest))
    return " ".join([word, *flags, rest])


def failed_step(translated: Translated, failing: str) -> str:
    """E2B's name of the step a build failed at, from sandboxd's BuildFailed
    step (BuildKit's ``[k/n] INSTRUCTION`` or the Dockerfile line): ``base``
    when it names none of the steps."""
    text = failing.strip()
    parsed = _VERTEX.match(text)
    if parsed:
        text = parsed.group(3).strip()

    def same(line: str) -> bool:
        if not text or line == text:
            return bool(text)
        # BuildKit shows exec forms joined, and may shorten a long instruction.
        shown = _display(line)
        core = shown.split(" ", 1)[-1]
        return shown.startswith(text[:60]) or text.endswith(core[-60:])

    vertices = translated.vertices
    if parsed:
        k = int(parsed.group(1))
        if 1 <= k <= len(vertices) and same(vertices[k - 1][1]):
            return vertices[k - 1][0]
    for step, line in vertices:
        if same(line):
            return step
    return BASE
