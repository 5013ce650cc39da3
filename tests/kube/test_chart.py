"""The Helm chart and the kustomize manifests against the real API server:
helm lint, helm template, server-side dry-run applies, and the control plane
running with the chart's RBAC only (enough, and nothing more)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import subprocess
from pathlib import Path

import pytest
from kubernetes import client as k8s_client

from sandboxd.backends.base import GVISOR, RUNC, LeaseMark, Limits, SandboxSpec
from sandboxd.backends.kubernetes import KubernetesBackend, KubernetesOptions, LeaderElector, PodOptions
from sandboxd.backends.kubernetes.client import KubeClient, KubeError
from sandboxd.backends.kubernetes.egress import EgressProxyRef, pool_policy_name
from sandboxd.backends.kubernetes.model_gateway import GatewayOptions
from sandboxd.backends.kubernetes.podspec import tenant_class
from sandboxd.backends.network.gateway import Grant, ModelGateway
from tests.kube.conftest import IMAGE

pytestmark = [pytest.mark.kube, pytest.mark.timeout(180)]

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "sandboxd"
CACHE = Path(os.environ.get("KUBE_CACHE", Path.home() / ".cache/sandboxd/kube"))


def _versions() -> dict[str, str]:
    out = {}
    for line in (ROOT / "deploy/testcluster/versions.sh").read_text().splitlines():
        if "=" in line and not line.startswith("#") and "$" not in line:
            key, _, value = line.partition("=")
            out[key.strip()] = value.split()[0]
    return out


def tool(name: str, version_key: str) -> str:
    path = CACHE / "bin" / f"{name}-{_versions()[version_key]}"
    if not path.exists():
        pytest.skip(f"{path} is not built (deploy/testcluster/build.sh)")
    return str(path)


def run(*argv: str, stdin: str | None = None, env: dict[str, str] | None = None) -> str:
    proc = subprocess.run(
        argv, input=stdin, capture_output=True, text=True, timeout=120, env={**os.environ, **(env or {})}
    )
    assert proc.returncode == 0, f"{argv[:3]} failed: {proc.stderr or proc.stdout}"
    return proc.stdout


def helm_template(helm: str, release_ns: str, sandbox_ns: str, *extra: str) -> str:
    return run(
        helm, "template", "sandboxd", str(CHART), "--namespace", release_ns,
        "--set", f"sandboxNamespace.name={sandbox_ns}", "--set", "leaderElection.enabled=true", *extra,
    )  # fmt: skip


def test_helm_lint() -> None:
    helm = tool("helm", "HELM_VERSION")
    out = run(helm, "lint", str(CHART), "--strict")
    assert "0 chart(s) failed" in out


async def test_template_and_kustomize_pass_server_side_dry_run(
    kubeconfig: str, kube: KubeClient, namespace: str
) -> None:
    helm, kubectl = tool("helm", "HELM_VERSION"), tool("kubectl", "KUBE_VERSION")
    for extra in ([], ["--set", "serviceMonitor.enabled=false", "--set", "persistence.enabled=true"]):
        rendered = await asyncio.to_thread(helm_template, helm, namespace, namespace, *extra)
        await asyncio.to_thread(
            run, kubectl, "apply", "--dry-run=server", "-n", namespace, "-f", "-", stdin=rendered,
            env={"KUBECONFIG": kubeconfig},
        )  # fmt: skip
    # The committed plain manifests are the chart's current rendering...
    fresh = await asyncio.to_thread(run, "bash", str(ROOT / "deploy/render.sh"), "-", env={"HELM": helm})
    assert fresh == (ROOT / "deploy/kustomize/sandboxd.yaml").read_text(), "run deploy/render.sh"
    # ...and the kustomization applies (its namespaces exist on the test cluster).
    for ns in ("sandboxd", "sandboxd-sandboxes"):
        with contextlib.suppress(KubeError):
            await kube.request("POST", "/api/v1/namespaces", body={"metadata": {"name": ns}})
    await asyncio.to_thread(
        run, kubectl, "apply", "--dry-run=server", "-k", str(ROOT / "deploy/kustomize"),
        env={"KUBECONFIG": kubeconfig},
    )  # fmt: skip


async def test_the_charts_rbac_is_enough_and_no_more(
    kubeconfig: str, kube: KubeClient, namespace: str
) -> None:
    helm, kubectl = tool("helm", "HELM_VERSION"), tool("kubectl", "KUBE_VERSION")
    # Sandboxes in `namespace`, the control plane's objects in a second one.
    release_ns = namespace + "-cp"
    await kube.request("POST", "/api/v1/namespaces", body={"metadata": {"name": release_ns}})
    instance = "rbac-" + secrets.token_hex(3)
    # A RuntimeClass of this test's own: the cluster's `gvisor` one stays as it is.
    probe_class = "gvisor-" + instance
    rendered = await asyncio.to_thread(
        helm_template,
        helm,
        release_ns,
        namespace,
        "--set",
        "replicaCount=0",
        "--set",
        f"instanceId={instance}",
        "--set",
        "sandbox.tenantQuotas=true",
        "--set",
        f"sandbox.gvisorRuntimeClassName={probe_class}",
    )
    try:
        await asyncio.to_thread(
            run, kubectl, "apply", "-f", "-", stdin=rendered, env={"KUBECONFIG": kubeconfig}
        )
        sa = "sandboxd"
        token = (
            await kube.request(
                "POST",
                f"/api/v1/namespaces/{release_ns}/serviceaccounts/{sa}/token",
                body={
                    "apiVersion": "authentication.k8s.io/v1",
                    "kind": "TokenRequest",
                    "spec": {"expirationSeconds": 3600},
                },
            )
        )["status"]["token"]
        cfg = k8s_client.Configuration()
        cfg.host = kube.cfg.host
        cfg.ssl_ca_cert = kube.cfg.ssl_ca_cert
        cfg.api_key = {"BearerToken": f"Bearer {token}"}
        as_sa = KubeClient(cfg, threads=4)
        backend = KubernetesBackend(
            KubernetesOptions(
                instance=instance,
                namespace=namespace,
                tenant_quotas=True,
                pod=PodOptions(namespace=namespace, instance=instance, gvisor_runtime_class=probe_class),
                egress_proxy=EgressProxyRef("sandboxd-egress", release_ns),
                model_gateway=GatewayOptions("127.0.0.1:0", "sandboxd", release_ns),
            ),
            as_sa,
        )
        backend.use_model_gateway(ModelGateway(lambda sid, key: Grant("", sid, ""), lambda call: None))
        try:
            await backend.ping()  # creates the NetworkPolicy, starts the watch
            handle = await backend.create(
                SandboxSpec(
                    "sb-" + secrets.token_hex(6), "p", IMAGE, Limits(memory_bytes=64 << 20, cpu_millis=100)
                )
            )
            assert [s.handle for s in await backend.list()] == [handle]
            # Pools and leases kept in the API server (the Ledger).
            await backend.save_pool_spec("p", '{"name": "p"}')
            assert await backend.load_pool_specs() == {"p": '{"name": "p"}'}
            # A pool with rules: the chart's proxy Service read, the pool's
            # NetworkPolicy made, and deleted with the pool's spec.
            networked = await backend.create(
                SandboxSpec(
                    "sb-" + secrets.token_hex(6), "p", IMAGE, Limits(memory_bytes=64 << 20, cpu_millis=100),
                    network=("pypi.internal",),
                )
            )  # fmt: skip
            policy = f"/apis/networking.k8s.io/v1/namespaces/{namespace}/networkpolicies/"
            await kube.request("GET", policy + pool_policy_name(instance, "p"))
            await backend.destroy(networked)
            # A pool with the model route: the control plane's Service read, its policy made.
            routed = await backend.create(
                SandboxSpec(
                    "sb-" + secrets.token_hex(6), "m", IMAGE, Limits(memory_bytes=64 << 20, cpu_millis=100),
                    model_gateway=True,
                )
            )  # fmt: skip
            await kube.request("GET", policy + pool_policy_name(instance, "m"))
            await backend.destroy(routed)
            await backend.delete_pool_spec("m")
            await backend.delete_pool_spec("p")
            with pytest.raises(KubeError) as gone:
                await kube.request("GET", policy + pool_policy_name(instance, "p"))
            assert gone.value.status == 404
            await backend.mark_leased(handle, LeaseMark("ls-1", "p", 60.0, 1e10, {"run": "r"}))
            assert [m[1:] for m in await backend.lease_marks()] == [
                (handle, LeaseMark("ls-1", "p", 60.0, 1e10, {"run": "r"}))
            ]
            memory, cpus = await backend.capacity()
            assert memory > 0 and cpus > 0
            # Tenant quotas: the tenant's PriorityClass (made by the create
            # above) and ResourceQuota, its headroom, and its removal.
            await backend.set_tenant_quota("default", 5, 1 << 30)
            assert (await backend.quota_headroom("default")).pods is not None
            await backend.set_tenant_quota("default", 0, 0)
            await backend.destroy(handle)
            elector = LeaderElector(
                as_sa,
                release_ns,
                "sandboxd-leader",
                "me",
                lease_duration=3,
                renew_deadline=2,
                retry_period=0.25,
            )
            await elector.wait_leading(timeout=20)
            await elector.stop()
            # The gVisor RuntimeClass, for pre-flight (absent where no node
            # runs gVisor: 404, not 403).
            with contextlib.suppress(KubeError):
                await kube.request("DELETE", f"/apis/node.k8s.io/v1/runtimeclasses/{probe_class}")
            await kube.request(
                "POST", "/apis/node.k8s.io/v1/runtimeclasses",
                body={"metadata": {"name": probe_class}, "handler": "runsc"},
            )  # fmt: skip
            assert (await as_sa.request("GET", f"/apis/node.k8s.io/v1/runtimeclasses/{probe_class}"))[
                "handler"
            ] == "runsc"
            assert GVISOR in await backend.runtimes()
            await kube.request("DELETE", f"/apis/node.k8s.io/v1/runtimeclasses/{probe_class}")
            with pytest.raises(KubeError) as missing:
                await as_sa.request("GET", f"/apis/node.k8s.io/v1/runtimeclasses/{probe_class}")
            assert missing.value.status == 404, missing.value
            assert await backend.runtimes() == {RUNC}
            # The egress proxy's Pods are listed (a change of a Pod's rules
            # waits for each to acknowledge it), not read one by one.
            await as_sa.request("GET", f"/api/v1/namespaces/{release_ns}/pods")
            # Nothing more: no Secrets, no other Pods outside the sandbox
            # namespace, no other Lease names.
            for method, path in [
                ("GET", f"/api/v1/namespaces/{namespace}/secrets"),
                ("GET", f"/api/v1/namespaces/{namespace}/configmaps"),
                ("GET", f"/api/v1/namespaces/{namespace}/configmaps/other"),
                ("GET", f"/api/v1/namespaces/{release_ns}/pods/x"),
                ("DELETE", f"/api/v1/namespaces/{release_ns}/pods/x"),
                ("GET", "/api/v1/namespaces/default/pods"),
                ("GET", f"/apis/coordination.k8s.io/v1/namespaces/{release_ns}/leases/other"),
                ("PATCH", f"/apis/networking.k8s.io/v1/namespaces/{namespace}/networkpolicies/x"),
                ("DELETE", f"/apis/networking.k8s.io/v1/namespaces/{release_ns}/networkpolicies/x"),
                ("GET", f"/api/v1/namespaces/{release_ns}/services/other"),
                ("GET", "/apis/scheduling.k8s.io/v1/priorityclasses"),
                ("DELETE", f"/apis/scheduling.k8s.io/v1/priorityclasses/{tenant_class('default')}"),
                ("GET", "/apis/node.k8s.io/v1/runtimeclasses"),
                ("GET", "/apis/node.k8s.io/v1/runtimeclasses/sandboxd"),
                ("DELETE", f"/apis/node.k8s.io/v1/runtimeclasses/{probe_class}"),
            ]:
                with pytest.raises(KubeError) as info:
                    await as_sa.request(method, path)
                assert info.value.status == 403, (method, path, info.value)
            # The egress proxy's account: sandbox Pods (watched, patched only
            # to acknowledge a change of their rules) and its own Service.
            as_proxy = KubeClient(_as(kube, await _token(kube, release_ns, "sandboxd-egress")), threads=2)
            try:
                # What PodPolicies asks (its watch takes a refusal for a cut stream, so asked here directly).
                query = {"labelSelector": "sandboxd.managed=true,sandboxd.io/none=x"}
                pods_path = f"/api/v1/namespaces/{namespace}/pods"
                assert not (await as_proxy.request("GET", pods_path, query=query))["items"]
                async for _ in as_proxy.watch(pods_path, {**query, "timeoutSeconds": "1"}):
                    pass
                with pytest.raises(KubeError) as absent:
                    await as_proxy.request(
                        "PATCH", f"{pods_path}/x", body={}, content_type="application/merge-patch+json"
                    )
                assert absent.value.status == 404, absent.value
                await as_proxy.request("GET", f"/api/v1/namespaces/{release_ns}/services/sandboxd-egress")
                for method, path in [
                    ("GET", f"/api/v1/namespaces/{namespace}/secrets"),
                    ("DELETE", f"/api/v1/namespaces/{namespace}/pods/x"),
                    ("POST", f"/api/v1/namespaces/{namespace}/pods"),
                    ("GET", f"/api/v1/namespaces/{release_ns}/pods"),
                    ("GET", f"/api/v1/namespaces/{release_ns}/services/other"),
                    ("GET", f"/api/v1/namespaces/{namespace}/configmaps"),
                ]:
                    with pytest.raises(KubeError) as info:
                        await as_proxy.request(method, path)
                    assert info.value.status == 403, (method, path, info.value)
            finally:
                await as_proxy.close()
        finally:
            await backend.close()
    finally:
        await asyncio.to_thread(
            run, kubectl, "delete", "--ignore-not-found", "--wait=false", "-f", "-",
            stdin=rendered, env={"KUBECONFIG": kubeconfig},
        )  # fmt: skip
        await kube.request("DELETE", f"/api/v1/namespaces/{release_ns}")
        with contextlib.suppress(KubeError):  # cluster-wide: made by the RuntimeClass check
            await kube.request("DELETE", f"/apis/node.k8s.io/v1/runtimeclasses/{probe_class}")
        with contextlib.suppress(KubeError):  # cluster-wide: made by the tenant-quota check
            await kube.request(
                "DELETE", f"/apis/scheduling.k8s.io/v1/priorityclasses/{tenant_class('default')}"
            )


async def _token(kube: KubeClient, namespace: str, account: str) -> str:
    """A token of the ServiceAccount ``account``."""
    answer = await kube.request(
        "POST",
        f"/api/v1/namespaces/{namespace}/serviceaccounts/{account}/token",
        body={
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {"expirationSeconds": 3600},
        },
    )
    return str(answer["status"]["token"])


def _as(kube: KubeClient, token: str) -> k8s_client.Configuration:
    cfg = k8s_client.Configuration()
    cfg.host = kube.cfg.host
    cfg.ssl_ca_cert = kube.cfg.ssl_ca_cert
    cfg.api_key = {"BearerToken": f"Bearer {token}"}
    return cfg


def test_the_rendered_config_loads_as_settings(tmp_path: Path) -> None:
    import yaml

    from sandboxd.settings import KubernetesBackendSettings, load_settings

    helm = tool("helm", "HELM_VERSION")
    rendered = helm_template(
        helm, "cp", "sbx", "--set", "sandbox.nodeSelector.pool=sandboxes",
        "--set", "sandbox.runtimeClassName=gvisor", "--set", "tenants.team-a.max_sandboxes=5",
        "--set", "presets[0].name=py", "--set", "presets[0].image=img:1",
        "--set", "sandbox.tolerations[0].key=dedicated", "--set", "sandbox.tolerations[0].operator=Exists",
        "--set", "sandbox.tolerations[1].key=slow", "--set", "sandbox.tolerations[1].tolerationSeconds=30",
    )  # fmt: skip
    cm = next(d for d in yaml.safe_load_all(rendered) if d and d["kind"] == "ConfigMap")
    path = tmp_path / "sandboxd.toml"
    path.write_text(cm["data"]["sandboxd.toml"])
    settings = load_settings(path)
    assert isinstance(settings.backend, KubernetesBackendSettings)
    assert settings.backend.namespace == "sbx"
    assert settings.backend.node_selector == {"pool": "sandboxes"}
    assert settings.backend.runtime_class == "gvisor"
    assert settings.backend.tolerations == [
        {"key": "dedicated", "operator": "Exists"},
        {"key": "slow", "tolerationSeconds": 30},
    ]
    assert settings.backend.leader_election is True
    # The chart's egress proxy, for pools with network rules.
    assert (settings.backend.egress_proxy_service, settings.backend.egress_proxy_namespace) == (
        "sandboxd-egress",
        "cp",
    )
    # The model gateway, on the control plane's Service.
    assert (
        settings.backend.model_gateway_listen,
        settings.backend.model_gateway_service,
        settings.backend.model_gateway_namespace,
    ) == ("0.0.0.0:8091", "sandboxd", "cp")
    assert settings.tenants["team-a"].max_sandboxes == 5
    assert settings.presets[0].image == "img:1"
