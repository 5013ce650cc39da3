"""Sandbox create+start under runc and crun, side by side in one run.

    python -m benchmarks.runtimes                 # ~1.5 minutes on 2 cores
    python -m benchmarks.runtimes --repeat 10     # fewer samples
    python -m benchmarks.runtimes --no-host-step  # crun as the host is, only
    python -m benchmarks.runtimes --no-hostile    # timing only (the suite is ~30 s more)

On a throwaway engine of its own (benchmarks/scale/engine.py; the host's
runtimes registered) with the default image, per runtime, interleaved so
both meet the same background load: ``create_start`` (container create and
start of a sandbox-like container: no network, init, ``sleep infinity``),
``first_exec`` (``true`` through the engine right after) and ``burst8``
(eight create+starts at once, the wall time of the eight). Containers are
removed after each sample, untimed.

crun 1.8 refuses cgroup v1 hosts whose cgroup2 mount still holds a
controller ("cgroups in hybrid mode not supported, drop all controllers
from cgroupv2"); such a host has ``hugetlb`` left on cgroup2. The host step
that fixes it is binding ``hugetlb`` to a v1 hierarchy, as systemd's hybrid
layout does. Unless ``--no-host-step``, the run tries that step in a way
that undoes itself: the v1 hierarchy is mounted in a private mount namespace
held by a child process (no other process sees the mount; the engine and the
kubelet keep their view), only while hugetlb is unused on cgroup2, and
unmounted at the end, which hands hugetlb back to cgroup2. crun's numbers
then say "with the host step". A runtime that cannot start a container is
reported unavailable with the engine's reason.

Where crun starts containers (with the step or without it), and unless
``--no-hostile``, the run then checks crun against the hostile suite, still
inside the step: ``tests/integration/test_hostile_docker.py -k crun`` with
``SANDBOXD_TEST_BACKEND_RUNTIMES=crun``, that is its 12 runc cases with
``[backend] runtime = "crun"`` against the host's engine (where the suite
runs; each case also asserts that its sandboxes' HostConfig.Runtime is
crun). ``hostile_crun`` records passed, failed and skipped cases from
pytest's JUnit XML, and each failing case with pytest's message.

Writes benchmarks/results/runtimes.json; its last stdout line is that JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import docker
import docker.errors

from benchmarks.scale.engine import Engine

RESULTS_PATH = Path(__file__).resolve().parent / "results" / "runtimes.json"
REPO = Path(__file__).resolve().parent.parent
HOSTILE_SUITE = "tests/integration/test_hostile_docker.py"
HOSTILE_WITHIN = 900.0
RUNTIMES = ("runc", "crun")
UNIFIED = Path("/sys/fs/cgroup/unified")
HYBRID_REFUSAL = "hybrid mode not supported"


def log(msg: str) -> None:
    print(f"[runtimes {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _start(engine: docker.DockerClient, image: str, runtime: str) -> Any:
    box = engine.containers.create(
        image, ["sleep", "infinity"], network_mode="none", init=True, runtime=runtime
    )
    try:
        box.start()
    except BaseException:
        with contextlib.suppress(docker.errors.APIError):
            box.remove(force=True)
        raise
    return box


def probe(engine: docker.DockerClient, image: str, runtime: str) -> str | None:
    """None when ``runtime`` starts a container here, else the engine's reason."""
    try:
        box = _start(engine, image, runtime)
    except docker.errors.APIError as e:
        return str(e.explanation or e)
    box.remove(force=True)
    return None


def sample(engine: docker.DockerClient, image: str, runtime: str) -> tuple[float, float]:
    """(create+start, first exec) seconds of one container."""
    t0 = time.perf_counter()
    box = _start(engine, image, runtime)
    t1 = time.perf_counter()
    try:
        result = box.exec_run(["true"])
        t2 = time.perf_counter()
        if result.exit_code != 0:
            raise RuntimeError(f"true exited {result.exit_code} under {runtime}")
    finally:
        box.remove(force=True)
    return t1 - t0, t2 - t1


def burst(engine: docker.DockerClient, image: str, runtime: str, n: int = 8) -> float:
    """Wall seconds of ``n`` create+starts at once."""
    boxes: list[Any] = []
    failures: list[BaseException] = []

    def one() -> None:
        try:
            boxes.append(_start(engine, image, runtime))
        except BaseException as e:
            failures.append(e)

    threads = [threading.Thread(target=one) for _ in range(n)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    for b in boxes:
        b.remove(force=True)
    if failures:
        raise failures[0]
    return wall


def stats_ms(xs: Sequence[float]) -> dict[str, float]:
    ms = sorted(x * 1000 for x in xs)
    return {
        "n": len(ms),
        "p50": round(statistics.median(ms), 1),
        "p90": round(ms[min(len(ms) - 1, int(0.9 * len(ms)))], 1),
        "mean": round(statistics.fmean(ms), 1),
    }


# -- the host step, undone at the end -------------------------------------------------


def hugetlb_on_cgroup2() -> bool:
    """Whether hugetlb is bound to cgroup2 and nothing there uses it (then it may move)."""
    try:
        available = (UNIFIED / "cgroup.controllers").read_text().split()
    except OSError:
        return False
    if "hugetlb" not in available:
        return False
    for d, _, _ in os.walk(UNIFIED):
        with contextlib.suppress(OSError):
            if "hugetlb" in (Path(d) / "cgroup.subtree_control").read_text().split():
                return False
    return True


@contextlib.contextmanager
def hugetlb_on_v1(within: float = 10.0) -> Iterator[str]:
    """hugetlb bound to a v1 hierarchy mounted in a private mount namespace of
    a child process, for the block's duration; yields what was done."""
    point = Path(tempfile.mkdtemp(prefix="hugetlb-v1-"))
    script = (
        f"mount -t cgroup -o hugetlb cgroup {point} || exit 1; echo mounted; "
        f"read _; umount {point}"  # holds the mount until stdin closes
    )
    child = subprocess.Popen(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    assert child.stdin is not None and child.stdout is not None and child.stderr is not None
    try:
        line = child.stdout.readline().decode().strip()
        if line != "mounted":
            raise RuntimeError(
                f"cannot bind hugetlb to a v1 hierarchy: {child.stderr.read().decode()[-300:]}"
            )
        yield "hugetlb bound to a v1 hierarchy (private mount namespace, undone at the end)"
    finally:
        child.stdin.close()
        try:
            child.wait(within)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait(within)
        with contextlib.suppress(OSError):
            point.rmdir()
        # Controllers come back to cgroup2 once the last v1 reference is gone.
        deadline = time.monotonic() + within
        while "hugetlb" not in (UNIFIED / "cgroup.controllers").read_text().split():
            if time.monotonic() > deadline:
                log("warning: hugetlb has not returned to cgroup2 yet")
                break
            time.sleep(0.1)


# -- the hostile suite under crun ------------------------------------------------------


def junit_outcomes(path: Path) -> dict[str, Any]:
    """Passed, failed (failures and errors) and skipped cases of pytest's JUnit
    XML at ``path``, one outcome per case (a teardown error counts as a failure)."""
    outcomes: dict[str, str] = {}
    messages: dict[str, str] = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        name = case.get("name", "")
        bad = [c for c in case if c.tag in ("failure", "error")]
        if bad:
            outcomes[name] = "failed"
            messages.setdefault(name, (bad[0].get("message") or bad[0].text or "").strip()[:400])
        elif any(c.tag == "skipped" for c in case):
            outcomes.setdefault(name, "skipped")
        else:
            outcomes.setdefault(name, "passed")
    counts: dict[str, Any] = {
        k: sum(1 for o in outcomes.values() if o == k) for k in ("passed", "failed", "skipped")
    }
    if messages:
        counts["failures"] = messages
    return counts


def hostile_under(engine_runtime: str, within: float = HOSTILE_WITHIN) -> dict[str, Any]:
    """The hostile suite's cases for runc pools under ``engine_runtime``, on the
    host's engine; pytest's output goes to stderr."""
    with tempfile.TemporaryDirectory(prefix="hostile-") as tmp:
        junit = Path(tmp) / "junit.xml"
        cmd = [
            sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", HOSTILE_SUITE,
            "-k", engine_runtime, f"--junitxml={junit}",
        ]  # fmt: skip
        env = {**os.environ, "SANDBOXD_TEST_BACKEND_RUNTIMES": engine_runtime}
        log(f"hostile suite under {engine_runtime}: {' '.join(cmd[1:])}")
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(
                cmd, cwd=REPO, env=env, stdout=sys.stderr, stderr=sys.stderr, timeout=within
            )
            rc: int | None = proc.returncode
        except subprocess.TimeoutExpired:
            rc = None
        out: dict[str, Any] = {
            "command": " ".join([f"SANDBOXD_TEST_BACKEND_RUNTIMES={engine_runtime}", "python", *cmd[1:-1]])
        }
        out["seconds"] = round(time.perf_counter() - t0, 1)
        if rc is None:
            out["error"] = f"pytest ran past {within:g}s"
        elif junit.exists():
            out.update(junit_outcomes(junit))
            out["pytest_exit"] = rc
        else:
            out["error"] = f"pytest exited {rc} without a report"
    return out


# -- the run --------------------------------------------------------------------------


def measure(engine: docker.DockerClient, image: str, runtimes: Sequence[str], repeat: int) -> dict[str, Any]:
    starts: dict[str, list[float]] = {r: [] for r in runtimes}
    execs: dict[str, list[float]] = {r: [] for r in runtimes}
    bursts: dict[str, list[float]] = {r: [] for r in runtimes}
    for r in runtimes:  # one unmeasured start each: page cache and engine metadata warm
        sample(engine, image, r)
    for i in range(repeat):
        for r in runtimes if i % 2 == 0 else list(reversed(runtimes)):
            s, e = sample(engine, image, r)
            starts[r].append(s)
            execs[r].append(e)
    for i in range(max(2, repeat // 5)):
        for r in runtimes if i % 2 == 0 else list(reversed(runtimes)):
            bursts[r].append(burst(engine, image, r))
    return {
        r: {
            "create_start_ms": stats_ms(starts[r]),
            "first_exec_ms": stats_ms(execs[r]),
            "burst8_ms": stats_ms(bursts[r]),
        }
        for r in runtimes
    }


def run(image: str, repeat: int, host_step: bool, hostile: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"image": image, "repeat": repeat}
    host = docker.from_env(timeout=120)
    with Engine("runtimes") as eng:
        out["image_load"] = eng.load_image(image, host)
        client = eng.client(timeout=120)
        registered = set((client.info().get("Runtimes") or {}).keys())
        reasons = {
            r: (probe(client, image, r) if r in registered else f"not registered with the engine ({r})")
            for r in RUNTIMES
        }
        out["unavailable"] = {r: why for r, why in reasons.items() if why}
        for r, why in out["unavailable"].items():
            log(f"{r} unavailable: {why}")
        usable = [r for r in RUNTIMES if not reasons[r]]
        step: contextlib.AbstractContextManager[str | None] = contextlib.nullcontext(None)
        crun_why = reasons.get("crun") or ""
        if host_step and HYBRID_REFUSAL in crun_why:
            if hugetlb_on_cgroup2():
                step = hugetlb_on_v1()
            else:
                out["host_step"] = "not tried: hugetlb is not on cgroup2, or a cgroup2 group uses it"
        with step as done:
            if done:
                out["host_step"] = done
                again = probe(client, image, "crun")
                out["crun_with_host_step"] = again or "works"
                log(f"crun with the host step: {out['crun_with_host_step']}")
                if again is None:
                    usable.append("crun")
            log(f"measuring {', '.join(usable)}: {repeat} samples each")
            out["runtimes"] = measure(client, image, usable, repeat)
            if not hostile:
                out["hostile_crun"] = {"not_run": "--no-hostile"}
            elif "crun" not in usable:
                out["hostile_crun"] = {"not_run": "crun cannot start a container here"}
            else:
                out["hostile_crun"] = hostile_under("crun")
                log(f"hostile suite under crun: {out['hostile_crun']}")
        client.close()
    host.close()
    m = out["runtimes"]
    for r in RUNTIMES:
        out[f"create_start_{r}_ms"] = m[r]["create_start_ms"]["p50"] if r in m else None
    if "runc" in m and "crun" in m:
        out["crun_vs_runc"] = round(
            m["crun"]["create_start_ms"]["p50"] / m["runc"]["create_start_ms"]["p50"], 3
        )
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.runtimes", description=(__doc__ or "").split("\n")[0]
    )
    p.add_argument("--repeat", type=int, default=30, help="sequential samples per runtime")
    p.add_argument("--no-host-step", dest="host_step", action="store_false",
                   help="do not try crun with hugetlb moved to a v1 hierarchy")  # fmt: skip
    p.add_argument("--no-hostile", dest="hostile", action="store_false",
                   help="do not run the hostile suite under crun after the timing")  # fmt: skip
    p.add_argument("--image", help="sandbox image (default: the default sandboxd image, built if missing)")
    p.add_argument("--output", type=Path, default=RESULTS_PATH)
    args = p.parse_args(argv)
    if os.geteuid() != 0:
        p.error("starts a dockerd of its own: run as root")
    image = args.image
    if image is None:
        from sandboxd.images.build import ensure_default_image

        image = ensure_default_image()
    result = run(image, max(2, args.repeat), args.host_step, args.hostile)
    result["machine"] = {
        "nproc": len(os.sched_getaffinity(0)),
        "kernel": platform.release(),
        "loadavg_1m": round(os.getloadavg()[0], 2),
    }
    result["started_at"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, separators=(",", ":")))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
