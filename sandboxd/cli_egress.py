"""``sandboxd egress-proxy``: the egress proxy the Helm chart runs for sandbox
Pods of pools with network rules (sandboxd.backends.kubernetes.egress_proxy)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
from typing import Any

__all__ = ["add_parser", "run"]


def add_parser(sub: Any) -> None:
    """Adds ``sandboxd egress-proxy`` and its flags to the CLI's subcommands."""
    ep = sub.add_parser("egress-proxy", help="sandbox Pods' egress proxy on Kubernetes (run by the chart)")
    ep.add_argument("--namespace", required=True, help="the sandbox Pods' namespace")
    ep.add_argument("--listen", default="0.0.0.0", help="address to listen on")
    ep.add_argument("--port", type=int, default=3128, help="the proxy's TCP port")
    ep.add_argument("--dns-port", type=int, default=5353, help="the resolver's UDP port")
    ep.add_argument("--service", default="", help="this proxy's Service (allowed names resolve to it)")
    ep.add_argument("--service-namespace", default=os.environ.get("POD_NAMESPACE", ""))
    ep.add_argument("--dns-answer", default="", help="what allowed names resolve to (not --service's)")
    ep.add_argument("--max-connections", type=int, default=64, help="per sandbox, at once")
    ep.add_argument("--bytes-per-second", type=int, default=64 << 20, help="per sandbox, both ways")
    ep.add_argument("--metrics-port", type=int, default=0, help="Prometheus /metrics port (0 = none)")
    ep.add_argument("--kubeconfig", default=None, help="default: in-cluster")
    ep.add_argument(
        "--ack-as",
        default=os.environ.get("POD_UID", ""),
        help="this proxy's Pod's uid, under which it acknowledges changes of a Pod's rules ('' = none)",
    )


async def _dns_answer(client: Any, args: argparse.Namespace) -> str:
    if args.dns_answer:
        return str(args.dns_answer)
    if not args.service:
        raise SystemExit("egress-proxy: --service or --dns-answer is needed")
    path = f"/api/v1/namespaces/{args.service_namespace or args.namespace}/services/{args.service}"
    svc = await client.request("GET", path)
    return str(svc["spec"]["clusterIP"])


async def run(args: argparse.Namespace) -> int:
    """Serves until interrupted."""
    from sandboxd.backends.kubernetes.client import KubeClient, load_configuration
    from sandboxd.backends.kubernetes.egress_proxy import PodPolicies, SharedEgress, register_proxy_meters
    from sandboxd.backends.network.proxy import EgressLimits
    from sandboxd.settings import TelemetrySettings
    from sandboxd.telemetry import Telemetry

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    client = KubeClient(load_configuration(args.kubeconfig, None), threads=8)
    policies = PodPolicies(client, args.namespace, ack_as=args.ack_as)
    egress = SharedEgress(
        policies,
        dns_answer=await _dns_answer(client, args),
        limits=EgressLimits(max_connections=args.max_connections, bytes_per_second=args.bytes_per_second),
    )
    telemetry = Telemetry(
        TelemetrySettings(
            service_name="sandboxd-egress-proxy", metrics_host=args.listen, metrics_port=args.metrics_port
        )
    )
    register_proxy_meters(telemetry.meter, egress)
    try:
        # Nothing is served before the first list of sandbox Pods is in.
        await policies.start()
        tcp, udp = await egress.start(args.listen, args.port, args.dns_port)
        await telemetry.start()
        logging.getLogger("sandboxd.egress").info(
            "egress proxy on %s: proxy %d/tcp, dns %d/udp", args.listen, tcp, udp
        )
        with contextlib.suppress(asyncio.CancelledError):
            await egress.serve_forever()
    finally:
        await telemetry.stop()
        await egress.close()
        await policies.stop()
        await client.close()
    return 0
