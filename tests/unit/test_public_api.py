"""The public modules export what they claim."""

from __future__ import annotations

import importlib
import inspect

import pytest

import sandboxd.client
import sandboxd.errors

pytestmark = pytest.mark.timeout(30)


@pytest.mark.parametrize("module_name", ["sandboxd.client", "sandboxd.errors"])
def test_every_name_in_all_is_importable(module_name: str) -> None:
    module = importlib.import_module(module_name)
    assert module.__all__, "empty __all__"
    assert len(set(module.__all__)) == len(module.__all__), "duplicates in __all__"
    for name in module.__all__:
        assert getattr(module, name, None) is not None, f"{module_name}.{name} is missing"
    namespace: dict[str, object] = {}
    exec(f"from {module_name} import *", namespace)  # what a star import really gives
    assert set(namespace) - {"__builtins__"} == set(module.__all__)


def test_client_exports_the_clients_and_their_types() -> None:
    assert set(sandboxd.client.__all__) == {"AsyncClient", "Client", "ExecResult", "Lease", "Sandbox"}
    from sandboxd.client import aio, sync

    assert sandboxd.client.AsyncClient is aio.AsyncClient
    assert sandboxd.client.Client is sync.Client
    for name in ("ExecResult", "Lease", "Sandbox"):
        assert getattr(sandboxd.client, name) is getattr(aio, name)


def test_errors_all_lists_the_whole_error_tree() -> None:
    defined = {
        name
        for name, obj in vars(sandboxd.errors).items()
        if inspect.isclass(obj) and obj.__module__ == "sandboxd.errors"
    }
    assert set(sandboxd.errors.__all__) == defined
    for name in sandboxd.errors.__all__:
        assert issubclass(getattr(sandboxd.errors, name), sandboxd.errors.SandboxdError)


def test_error_tree_shape() -> None:
    e = sandboxd.errors
    assert issubclass(e.TransientBackendError, e.BackendError)
    assert issubclass(e.PermanentBackendError, e.BackendError)
    assert issubclass(e.SandboxLost, e.BackendError)
    err = e.InvalidArgument("spec.name", "is required")
    assert err.field == "spec.name"
    assert err.message == str(err) == "spec.name: is required"
    assert e.ResourceExhausted("full", 1.5).retry_after == 1.5
