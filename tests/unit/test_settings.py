"""Settings resolution: the one Limits type in its three roles, and the
Docker engine's address from [backend] base_url, else DOCKER_HOST (read by
the entry point only), else the local socket."""

from __future__ import annotations

import argparse
from dataclasses import fields
from typing import Any

import pytest

from sandboxd.backends.base import Limits
from sandboxd.cli import _settings
from sandboxd.errors import InvalidArgument
from sandboxd.settings import DEFAULT_LIMITS, DockerBackendSettings, load_settings

pytestmark = pytest.mark.timeout(10)


def test_one_limits_type_and_the_server_defaults() -> None:
    names = [f.name for f in fields(Limits)]
    assert names == [
        "memory_bytes",
        "cpu_millis",
        "pids",
        "disk_bytes",
        "max_files",
        "output_bytes",
        "lifetime_seconds",
    ]
    s = load_settings()
    assert s.limits == DEFAULT_LIMITS
    assert (s.limits.memory_bytes, s.limits.pids, s.limits.max_files) == (512 << 20, 256, 20_000)


def test_a_partial_limits_section_keeps_the_other_defaults() -> None:
    s = load_settings(overrides={"limits.memory_bytes": 1 << 30})
    assert s.limits == Limits(**{**vars(DEFAULT_LIMITS), "memory_bytes": 1 << 30})


def test_a_tenant_ceiling_is_limits_with_zero_as_no_ceiling() -> None:
    s = load_settings(overrides={"tenants.alice.ceiling.pids": 32})
    assert s.tenants["alice"].ceiling == Limits(pids=32)


def test_unknown_limit_keys_are_rejected() -> None:
    with pytest.raises(InvalidArgument, match=r"limits\.memory"):
        load_settings(overrides={"limits.memory": 1})
    with pytest.raises(InvalidArgument, match=r"tenants\.a\.ceiling\.cpus"):
        load_settings(overrides={"tenants.a.ceiling.cpus": 1})


def docker(
    overrides: dict[str, Any] | None = None, environ: dict[str, str] | None = None
) -> DockerBackendSettings:
    s = load_settings(None, overrides, environ)
    assert isinstance(s.backend, DockerBackendSettings)
    return s.backend


def test_docker_host_is_the_engine_address_when_base_url_is_unset() -> None:
    assert docker(environ={"DOCKER_HOST": "tcp://10.0.0.5:2375"}).base_url == "tcp://10.0.0.5:2375"
    assert docker(environ={}).base_url is None
    assert docker(environ={"DOCKER_HOST": ""}).base_url is None


def test_base_url_wins_over_docker_host() -> None:
    got = docker(
        overrides={"backend.base_url": "unix:///run/other.sock"},
        environ={"DOCKER_HOST": "tcp://10.0.0.5:2375"},
    )
    assert got.base_url == "unix:///run/other.sock"


def test_only_the_environment_passed_in_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCKER_HOST", "tcp://10.0.0.5:2375")
    assert docker().base_url is None


def test_an_unsupported_docker_host_is_a_clear_error() -> None:
    with pytest.raises(InvalidArgument, match=r"^DOCKER_HOST: unsupported Docker engine address 'ssh://h'"):
        load_settings(environ={"DOCKER_HOST": "ssh://h"})
    with pytest.raises(InvalidArgument, match=r"^backend\.base_url: unsupported"):
        load_settings(overrides={"backend.base_url": "unix://"})


def test_other_backends_ignore_docker_host() -> None:
    s = load_settings(overrides={"backend.kind": "fake"}, environ={"DOCKER_HOST": "ssh://h"})
    assert s.backend.kind == "fake"


def test_the_cli_reads_docker_host(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCKER_HOST", "unix:///run/user/1000/docker.sock")
    s = _settings(argparse.Namespace(config=None))
    assert isinstance(s.backend, DockerBackendSettings)
    assert s.backend.base_url == "unix:///run/user/1000/docker.sock"
