"""`sandboxd serve` flags become settings: the Kubernetes backend by flag."""

from __future__ import annotations

import argparse

import pytest

from sandboxd.cli import _settings
from sandboxd.errors import InvalidArgument
from sandboxd.settings import KubernetesBackendSettings

pytestmark = pytest.mark.timeout(10)


def args(**kw: object) -> argparse.Namespace:
    return argparse.Namespace(config=None, **kw)


def test_backend_kubernetes_with_kubeconfig_and_namespace() -> None:
    s = _settings(args(backend="kubernetes", kubeconfig="/etc/k.conf", namespace="sbx"))
    assert isinstance(s.backend, KubernetesBackendSettings)
    assert (s.backend.kubeconfig, s.backend.namespace) == ("/etc/k.conf", "sbx")


def test_kubernetes_flags_need_the_kubernetes_backend() -> None:
    with pytest.raises(InvalidArgument, match="backend.namespace"):
        _settings(args(backend="docker", namespace="sbx"))


def test_serve_lifts_the_soft_open_files_limit_to_the_hard_one() -> None:
    import subprocess
    import sys

    # In a child: the limit is the process's own, and this one must keep its.
    code = (
        "import resource; from sandboxd.cli import _raise_open_files_limit as up\n"
        "soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard)); up()\n"
        "now = resource.getrlimit(resource.RLIMIT_NOFILE)\n"
        "assert now[1] == hard and now[0] == (hard if hard != resource.RLIM_INFINITY else 1 << 20), now\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
