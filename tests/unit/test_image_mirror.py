"""The Debian mirror the image recipes bootstrap from: the override, then
the host's apt sources in either format, then deb.debian.org."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandboxd.images.mirror import DEFAULT_MIRROR, MIRROR_ENV, debian_mirror


@pytest.fixture(autouse=True)
def no_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(MIRROR_ENV, raising=False)


def test_override_wins(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    listed = tmp_path / "sources.list"
    listed.write_text("deb http://listed.example/debian bookworm main\n")
    monkeypatch.setenv(MIRROR_ENV, "http://override.example/debian/")
    assert debian_mirror("bookworm", [listed]) == "http://override.example/debian"


def test_one_line_source_for_the_suite(tmp_path: Path) -> None:
    listed = tmp_path / "sources.list"
    listed.write_text(
        "# deb http://commented.example/debian bookworm main\n"
        "deb http://other-suite.example/debian bullseye main\n"
        "deb mirror+file:///etc/apt/mirrors.txt bookworm main\n"
        "deb [arch=amd64 signed-by=/k.gpg] http://listed.example/debian/ bookworm main\n"
    )
    assert debian_mirror("bookworm", [listed]) == "http://listed.example/debian"


def test_deb822_source_skips_disabled_and_source_only(tmp_path: Path) -> None:
    sources = tmp_path / "debian.sources"
    sources.write_text(
        "Types: deb\nURIs: http://disabled.example/debian\nSuites: bookworm\nEnabled: no\n\n"
        "Types: deb-src\nURIs: http://src.example/debian\nSuites: bookworm\n\n"
        "# a comment\nTypes: deb\nURIs: http://first.example/debian\n"
        "  http://second.example/debian\nSuites: bookworm bookworm-updates\nComponents: main\n"
    )
    assert debian_mirror("bookworm", [sources]) == "http://first.example/debian"


def test_nothing_for_the_suite_falls_back(tmp_path: Path) -> None:
    listed = tmp_path / "sources.list"
    listed.write_text("deb http://other-suite.example/debian trixie main\n")
    assert debian_mirror("bookworm", [listed, tmp_path / "missing.list"]) == DEFAULT_MIRROR
