"""E2B templates as sandboxd serves them: a template name is a pool, and
optionally one of the images that pool serves (per-task images), given on
the command line as ``NAME=POOL[:IMAGE]`` or in a templates file whose
entries may also name a build recipe (a Dockerfile and its context).

This module only reads and checks: building a recipe needs the image cache,
which lives on the server side, so whoever starts the front end builds the
recipes (``Recipe``) and hands over the finished templates."""

from __future__ import annotations

import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["Recipe", "Template", "TemplatesError", "load_templates", "parse_template_flags"]


class TemplatesError(ValueError):
    """A template definition that cannot be used, saying which and why."""


@dataclass(frozen=True)
class Template:
    """Where an E2B template's sandboxes come from."""

    pool: str
    """The sandboxd pool they are leased from."""
    image: str = ""
    """One of the pool's images (``PoolSpec.images``); "" = the pool's own."""


@dataclass(frozen=True)
class Recipe:
    """A template whose image is built from a Dockerfile, as ``sandboxd
    image build --context`` builds one; its tag becomes the template's image."""

    name: str
    pool: str
    context: Path
    dockerfile: str = "Dockerfile"
    build_args: Mapping[str, str] = field(default_factory=dict)


def _check_name(name: str, what: str) -> None:
    if not name or any(c.isspace() for c in name) or "/" in name:
        raise TemplatesError(f"{what} {name!r} must be a non-empty name without spaces or '/'")


def parse_template_flags(values: Iterable[str]) -> dict[str, Template]:
    """``--template NAME=POOL`` or ``NAME=POOL:IMAGE`` values. A pool name
    has no ':', so everything after the first one is the image reference
    (which may carry its own tag: ``py=any:python:3.12-slim``)."""
    out: dict[str, Template] = {}
    for value in values:
        name, sep, target = value.partition("=")
        pool, _, image = target.partition(":")
        if not sep or not name or not pool:
            raise TemplatesError(f"--template takes NAME=POOL or NAME=POOL:IMAGE, not {value!r}")
        _check_name(name, "template")
        if value.endswith(":"):
            raise TemplatesError(f"--template {value!r} names no image after ':'")
        out[name] = Template(pool, image)
    return out


def _strings(entry: Mapping[str, Any], key: str, where: str) -> dict[str, str]:
    value = entry.get(key, {})
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise TemplatesError(f"{where}.{key} must be a table of strings")
    return dict(value)


def _entry(name: str, entry: Any, base: Path) -> Template | Recipe:
    where = f"templates.{name}"
    if not isinstance(entry, dict):
        raise TemplatesError(f"{where} must be a table (pool = ..., image = ... or context = ...)")
    unknown = set(entry) - {"pool", "image", "context", "dockerfile", "build_args"}
    if unknown:
        raise TemplatesError(f"{where} has unknown keys {sorted(unknown)}")
    pool = entry.get("pool")
    if not isinstance(pool, str) or not pool or ":" in pool:
        raise TemplatesError(f"{where}.pool is required: the name of a sandboxd pool")
    image, context = entry.get("image", ""), entry.get("context", "")
    if not isinstance(image, str) or not isinstance(context, str):
        raise TemplatesError(f"{where}.image and {where}.context must be strings")
    if image and context:
        raise TemplatesError(f"{where} names both an image and a context: one or the other")
    if not context:
        if "dockerfile" in entry or "build_args" in entry:
            raise TemplatesError(f"{where}: dockerfile and build_args need a context")
        return Template(pool, image)
    dockerfile = entry.get("dockerfile", "Dockerfile")
    if not isinstance(dockerfile, str) or not dockerfile:
        raise TemplatesError(f"{where}.dockerfile must be a path inside the context")
    return Recipe(name, pool, base / context, dockerfile, _strings(entry, "build_args", where))


def load_templates(path: Path) -> tuple[dict[str, Template], list[Recipe]]:
    """A templates file's ready templates and its recipes still to build.

    The file is TOML with one ``[templates.NAME]`` table per template:
    ``pool`` (required), and ``image`` or ``context`` (a directory; relative
    to the file) with optional ``dockerfile`` and ``build_args``."""
    try:
        with path.open("rb") as fh:
            data = tomllib.load(fh)
    except OSError as e:
        raise TemplatesError(f"cannot read the templates file {path}: {e.strerror}") from e
    except tomllib.TOMLDecodeError as e:
        raise TemplatesError(f"templates file {path} is not TOML: {e}") from e
    unknown = set(data) - {"templates"}
    if unknown:
        raise TemplatesError(f"templates file {path} has unknown sections {sorted(unknown)}")
    entries = data.get("templates", {})
    if not isinstance(entries, dict):
        raise TemplatesError(f"templates file {path}: [templates.NAME] tables expected")
    ready: dict[str, Template] = {}
    recipes: list[Recipe] = []
    for name, entry in entries.items():
        _check_name(name, "template")
        parsed = _entry(name, entry, path.parent)
        if isinstance(parsed, Recipe):
            recipes.append(parsed)
        else:
            ready[name] = parsed
    return ready, recipes
