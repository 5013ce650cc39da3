"""Which Debian mirror the image recipes bootstrap from.

A rollout host often reaches exactly one package mirror (its own apt
source), so the recipe asks apt's configuration rather than assuming
deb.debian.org: both apt source formats are read, one-line ``.list`` files
and deb822 ``.sources`` files.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from urllib.parse import urlsplit

DEFAULT_MIRROR = "http://deb.debian.org/debian"
MIRROR_ENV = "SANDBOXD_DEBIAN_MIRROR"


def _apt_source_files() -> list[Path]:
    files: list[Path] = []
    main_list = Path("/etc/apt/sources.list")
    if main_list.is_file():
        files.append(main_list)
    parts = Path("/etc/apt/sources.list.d")
    if parts.is_dir():
        # apt ignores other suffixes (e.g. "*.list.disabled"), so do we.
        files.extend(sorted(p for p in parts.iterdir() if p.suffix in (".list", ".sources")))
    return files


def _one_line_sources(text: str) -> Iterator[tuple[str, list[str]]]:
    pattern = re.compile(r"^deb\s+(?:\[[^\]]*\]\s+)?(\S+)\s+(\S+)")
    for line in text.splitlines():
        match = pattern.match(line.split("#", 1)[0].strip())
        if match:
            yield match.group(1), [match.group(2)]


def _deb822_sources(text: str) -> Iterator[tuple[str, list[str]]]:
    for paragraph in re.split(r"\n\s*\n", text):
        fields: dict[str, str] = {}
        key = ""
        for line in paragraph.splitlines():
            if line.startswith("#"):
                continue
            if line[:1].isspace() and key:
                fields[key] += " " + line.strip()
            elif ":" in line:
                key, value = line.split(":", 1)
                key = key.strip().lower()
                fields[key] = value.strip()
        if "deb" not in fields.get("types", "").split():
            continue
        if fields.get("enabled", "yes").lower() == "no":
            continue
        suites = fields.get("suites", "").split()
        for uri in fields.get("uris", "").split():
            yield uri, suites


def debian_mirror(suite: str, source_files: Sequence[Path] | None = None) -> str:
    """Return the Debian mirror to bootstrap ``suite`` from.

    ``$SANDBOXD_DEBIAN_MIRROR`` wins; otherwise the first enabled apt source
    for the suite, because on locked-down hosts that is the one mirror known
    to be reachable; otherwise deb.debian.org. ``source_files`` replaces
    apt's own (``/etc/apt/sources.list`` and ``sources.list.d``).
    """
    override = os.environ.get(MIRROR_ENV)
    if override:
        return override.rstrip("/")
    for path in _apt_source_files() if source_files is None else source_files:
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        parse = _deb822_sources if path.suffix == ".sources" else _one_line_sources
        for uri, suites in parse(text):
            # debootstrap only speaks plain URLs, not apt's mirror+/tor+ schemes.
            if suite in suites and urlsplit(uri).scheme in ("http", "https", "file"):
                return uri.rstrip("/")
    return DEFAULT_MIRROR
