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
