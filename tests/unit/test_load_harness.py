"""The load harness's own logic: profiles, distributions, percentiles, plans,
the leak check, bounds, and the episode driver against an in-process server
on the fake backend."""

from __future__ import annotations

import asyncio
import json
import math
import random
import textwrap
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from benchmarks.load import cli
from benchmarks.load.dists import Dist, ProfileError, parse_dist
from benchmarks.load.episode import ExecOutcome, Plan, Write, file_content, plan_episode
from benchmarks.load.floor import FloorBox, FloorDriver
from benchmarks.load.leaks import leased_leftovers, leftovers
from benchmarks.load.profile import PRESETS, Profile, load_profile, parse_profile
from benchmarks.load.report import build_report, compare, render
from benchmarks.load.runner import Sampler, play_profile
from benchmarks.load.sandboxd_driver import SandboxdDriver
from benchmarks.load.stats import Bounds, Recorder, Stopped, percentile, summary_ms
from sandboxd.app import App, build_app
from sandboxd.backends.fake import FakeBackend
from sandboxd.client import AsyncClient
from tests.unit.conftest import make_settings

IMAGE = "sandboxd/unit:latest"

# Commands the fake backend's small shell understands.
FAKE_PROFILE = {
    "name": "fake",
    "run": {"mode": "step-sync", "rollouts": 6, "group_size": 3, "steps": 2, "max_seconds": 30, "seed": 7},
    "episode": {
        "turns": {"dist": "lognormal", "median": 3, "sigma": 0.6, "min": 1, "max": 6},
        "think_seconds": 0.0,
        "execs_per_turn": {"dist": "uniform", "min": 1, "max": 3},
        "session_fraction": 0.6,
        "files_per_turn": {"dist": "uniform", "min": 0, "max": 2},
        "file_bytes": {"dist": "lognormal", "median": 500, "sigma": 0.5, "min": 64, "max": 4096},
        "snapshot_probability": 0.0,
    },
    "commands": {
        "setup": ["cd /workspace", "export X=1"],
        "session": ["cat {file}", "echo turn {turn}", "pwd", "env"],
        "oneshot": ["cat {file}", "true", "echo r{rollout}"],
        "reward": "cat {file}",
    },
}


def fake_profile(**overrides: Any) -> Profile:
    return parse_profile(FAKE_PROFILE, overrides=overrides)


# -- profiles ---------------------------------------------------------------------


@pytest.mark.timeout(10)
@pytest.mark.parametrize("name", PRESETS)
@pytest.mark.parametrize("quick", [False, True])
def test_presets_parse(name: str, quick: bool) -> None:
    p = load_profile(name, quick=quick)
    assert p.name == name
    assert p.run.max_seconds > 0 and p.run.max_requests > 0
    assert p.episode.turns.lo >= 1 and math.isfinite(p.episode.turns.hi)
    assert math.isfinite(p.episode.think_seconds.hi)


@pytest.mark.timeout(10)
def test_quick_and_flag_overrides_apply() -> None:
    full = load_profile("step-sync")
    quick = load_profile("step-sync", quick=True, overrides={"run.rollouts": 16})
    assert full.run.steps > 1 and quick.run.steps == 1
    assert quick.run.rollouts == 16 and full.run.rollouts == 128


@pytest.mark.timeout(10)
def test_a_profile_file_round_trips(tmp_path: Path) -> None:
    path = tmp_path / "mine.toml"
    path.write_text(
        textwrap.dedent("""
        [run]
        mode = "open"
        rollouts = 4
        concurrency = 2
        arrival_rate = 5.0
        [episode]
        turns = 2
        [commands]
        oneshot = ["true"]
        session = ["pwd"]
        reward = "cat {file}"
        """)
    )
    p = load_profile(str(path))
    assert p.name == "mine"  # from the file name
    assert p.run.mode == "open" and p.run.in_flight == 2
    assert p.episode.turns == Dist("constant", 2.0, lo=2.0, hi=2.0, integer=True)


DELETE = object()
BAD: list[tuple[dict[str, Any], str]] = [
    ({"run.mode": DELETE}, "run.mode: missing"),
    ({"run.mode": "sideways"}, "run.mode: must be one of"),
    ({"run.rollouts": 0}, r"run.rollouts: must be in \[1"),
    ({"run.rollouts": "many"}, "run.rollouts: must be an integer"),
    ({"run.colour": 1}, "run: unknown key.*colour"),
    ({"run.steps": 2}, "run.steps: only step-sync"),
    ({"run.refill": "between-steps"}, "run.refill: only step-sync"),
    ({"run.mode": "step-sync", "run.refill": "lazily"}, "run.refill: must be one of"),
    ({"episode.turns": {"dist": "zipf"}}, "episode.turns.dist: must be one of"),
    ({"episode.turns": {"dist": "lognormal", "median": 3}}, "episode.turns: missing 'sigma'"),
    ({"episode.turns": {"dist": "uniform", "min": 5, "max": 2}}, "episode.turns: min 5 is above max 2"),
    ({"episode.turns": {"dist": "uniform", "min": 0, "max": 2}}, "at least one turn"),
    ({"episode.turns": {"dist": "pareto", "scale": 1, "alpha": 1.5, "mode": 2}}, "unknown key.*mode"),
    ({"episode.file_bytes": 10_000_000}, "episode.file_bytes: max must be bounded"),
    ({"episode.think_seconds": -1}, r"episode.think_seconds.value: must be >= 0"),
    ({"episode.session_fraction": 1.5}, r"episode.session_fraction: must be in \[0, 1\]"),
    ({"commands.reward": "cat {path}"}, r"commands.reward: unknown placeholder\(s\) \{path\}"),
    ({"commands.reward": DELETE}, "commands.reward: missing"),
    ({"commands.session": "pwd"}, "commands.session: must be a list"),
    ({"commands.session": []}, "commands.session: empty"),
    ({"colour": "red"}, "profile: unknown key"),
]


@pytest.mark.timeout(10)
@pytest.mark.parametrize(("patch", "message"), BAD)
def test_bad_profiles_name_the_key(patch: dict[str, Any], message: str) -> None:
    doc: dict[str, Any] = {
        "name": "bad",
        "run": {"mode": "burst", "rollouts": 1},
        "episode": {"turns": 3},
        "commands": {"session": ["pwd"], "oneshot": ["true"], "reward": "true"},
    }
    for dotted, value in patch.items():
        section, _, key = dotted.partition(".")
        table = doc[section] if key else doc
        name = key or section
        if value is DELETE:
            del table[name]
        else:
            table[name] = value
    with pytest.raises(ProfileError, match=message):
        parse_profile(doc)


@pytest.mark.timeout(10)
def test_bad_files_say_which_file(tmp_path: Path) -> None:
    broken = tmp_path / "broken.toml"
    broken.write_text("[run\nmode = 1\n")
    with pytest.raises(ProfileError, match="not valid TOML"):
        load_profile(str(broken))
    wrong = tmp_path / "wrong.toml"
    wrong.write_text('[run]\nmode = "burst"\nrollouts = -3\n')
    with pytest.raises(ProfileError, match=r"wrong.toml: run.rollouts"):
        load_profile(str(wrong))
    with pytest.raises(ProfileError, match="neither a preset"):
        load_profile(str(tmp_path / "absent.toml"))


# -- distributions ------------------------------------------------------------------


@pytest.mark.timeout(10)
def test_draws_are_seeded() -> None:
    d = parse_dist("x", {"dist": "pareto", "scale": 1.0, "alpha": 1.2, "max": 100})
    a = [d.sample(random.Random("s/0/1")) for _ in range(5)]
    b = [d.sample(random.Random("s/0/1")) for _ in range(5)]
    assert a == b
    assert d.sample(random.Random("s/0/2")) != d.sample(random.Random("s/0/1"))


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    "spec",
    [
        {"dist": "lognormal", "median": 4, "sigma": 1.2, "min": 1, "max": 30},
        {"dist": "pareto", "scale": 2, "alpha": 1.1, "min": 2, "max": 40},
        {"dist": "exponential", "mean": 3, "min": 1, "max": 20},
        {"dist": "uniform", "min": 2, "max": 5},
    ],
)
def test_draws_stay_in_bounds_and_counts_are_whole(spec: dict[str, Any]) -> None:
    d = parse_dist("x", spec, integer=True)
    rng = random.Random(1)
    xs = [d.sample(rng) for _ in range(5000)]
    assert min(xs) >= spec["min"] and max(xs) <= spec["max"]
    assert all(x == int(x) for x in xs)
    assert min(xs) == spec["min"]


@pytest.mark.timeout(10)
def test_long_tails_are_long() -> None:
    rng = random.Random(3)
    for spec in (
        {"dist": "lognormal", "median": 5, "sigma": 1.0},
        {"dist": "pareto", "scale": 5, "alpha": 1.3},
    ):
        d = parse_dist("x", spec, upper=1e9)
        xs = [d.sample(rng) for _ in range(20000)]
        assert percentile(xs, 50) == pytest.approx(
            5 if spec["dist"] == "lognormal" else 5 * 2 ** (1 / 1.3), rel=0.1
        )
        assert percentile(xs, 99) / percentile(xs, 50) > 8  # a uniform or normal shape would not do this


@pytest.mark.timeout(10)
def test_missing_max_takes_the_hard_cap() -> None:
    d = parse_dist("episode.turns", {"dist": "pareto", "scale": 1, "alpha": 0.5}, integer=True, upper=1000)
    assert d.hi == 1000
    assert max(d.sample(random.Random(i)) for i in range(2000)) <= 1000


# -- percentiles --------------------------------------------------------------------


@pytest.mark.timeout(10)
def test_percentiles_interpolate_like_numpy() -> None:
    xs = [4.0, 1.0, 3.0, 2.0]
    assert percentile(xs, 0) == 1.0
    assert percentile(xs, 100) == 4.0
    assert percentile(xs, 50) == 2.5
    assert percentile(xs, 90) == pytest.approx(3.7)
    assert percentile(list(range(101)), 99) == pytest.approx(99.0)
    assert percentile([7.0], 99) == 7.0
    assert math.isnan(percentile([], 50))
    with pytest.raises(ValueError):
        percentile(xs, 101)


@pytest.mark.timeout(10)
def test_summary_is_in_milliseconds() -> None:
    s = summary_ms([0.001, 0.002, 0.003])
    assert s == {"n": 3, "mean": 2.0, "p50": 2.0, "p90": 2.8, "p99": 2.98, "max": 3.0}
    assert summary_ms([])["p99"] is None


# -- plans ------------------------------------------------------------------------


@pytest.mark.timeout(10)
def test_plans_are_the_same_for_both_drivers_and_differ_per_rollout() -> None:
    p = load_profile("step-sync")
    assert plan_episode(p, 5, 1) == plan_episode(p, 5, 1)
    assert plan_episode(p, 5, 1) != plan_episode(p, 6, 1)
    assert plan_episode(p, 5, 0) != plan_episode(p, 5, 1)
    turns = [len(plan_episode(p, r).turns) for r in range(300)]
    assert min(turns) >= 1 and max(turns) <= 16 and max(turns) >= 3 * percentile(turns, 50)


@pytest.mark.timeout(10)
def test_commands_get_the_last_written_file() -> None:
    plan = plan_episode(fake_profile(), 2)
    last = "main.py"
    for turn in plan.turns:
        for action in turn.actions:
            if isinstance(action, Write):
                last = action.files[-1][0]
            elif "{" in action.command or "cat" in action.command:
                assert "{" not in action.command
                if action.command.startswith("cat "):
                    assert action.command == f"cat {last}"
    assert plan.reward == f"cat {last}"


@pytest.mark.timeout(10)
def test_file_content_has_the_size_asked_and_runs() -> None:
    for size in (10, 64, 200, 1000, 4097):
        body = file_content("a.py", size, "t")
        assert body.endswith(b"print('ok t')\n")
        if size >= 64:
            assert len(body) == size
        compile(body, "a.py", "exec")


# -- bounds and recorder ------------------------------------------------------------


@pytest.mark.timeout(10)
async def test_the_request_bound_stops_the_run() -> None:
    bounds = Bounds(max_seconds=10, max_requests=2)
    bounds.take()
    bounds.take()
    with pytest.raises(Stopped):
        bounds.take()
    assert bounds.stop.is_set() and bounds.stopped_by == "max_requests"


@pytest.mark.timeout(10)
async def test_recorder_types_errors() -> None:
    rec = Recorder(Bounds(10, 10), classify=lambda e: f"kind:{type(e).__name__}")

    async def boom() -> None:
        raise KeyError("x")

    with pytest.raises(Exception, match="op"):
        await rec.call("op", boom)
    assert rec.errors == {"kind:KeyError": 1}
    assert "op" not in rec.latencies


# -- the runner on an in-memory driver -------------------------------------------------


@dataclass
class MemoryDriver:
    """A driver with no server: counts what the runner asks of it."""

    name: str = "memory"
    snapshots: bool = False
    held: int = 0
    most_held: int = 0
    acquires: list[int] = field(default_factory=list)
    releases: int = 0
    fail_command: str = ""

    async def acquire(self, n: int, labels: Mapping[str, str]) -> Sequence[object]:
        self.acquires.append(n)
        self.held += n
        self.most_held = max(self.most_held, self.held)
        await asyncio.sleep(0)  # a suspension point like a real driver's, not a wait for a condition
        return [object() for _ in range(n)]

    async def exec(self, box: object, command: str, *, session: bool, timeout: float) -> ExecOutcome:
        await asyncio.sleep(0)  # a suspension point like a real driver's, not a wait for a condition
        return ExecOutcome("EXITED", 1 if command == self.fail_command else 0)

    async def write(self, box: object, files: Sequence[tuple[str, bytes]]) -> None:
        await asyncio.sleep(0)  # a suspension point like a real driver's, not a wait for a condition

    async def snapshot(self, box: object) -> None:
        await asyncio.sleep(0)  # a suspension point like a real driver's, not a wait for a condition

    async def release(self, boxes: Sequence[object]) -> None:
        self.held -= len(boxes)
        self.releases += 1

    def classify(self, error: BaseException) -> str:
        return f"memory:{type(error).__name__}"

    async def sample(self) -> dict[str, int]:
        return {"held": self.held}


@pytest.mark.timeout(20)
async def test_step_sync_runs_every_group_of_every_step() -> None:
    driver = MemoryDriver()
    raw = await play_profile(driver, fake_profile(**{"run.rollouts": 7}), run_id="t")
    assert driver.acquires == [3, 3, 1, 3, 3, 1]
    assert driver.most_held == 7 and driver.held == 0 and driver.releases == 6
    assert len(raw["step_s"]) == 2 and raw["errors"] == {}
    assert raw["episodes"] == {"planned": 14, "completed": 14, "failed": 0, "cut_by_bounds": 0}


@pytest.mark.timeout(20)
async def test_open_mode_keeps_to_its_concurrency() -> None:
    driver = MemoryDriver()
    profile = fake_profile(
        **{"run.mode": "open", "run.steps": 1, "run.rollouts": 20, "run.group_size": 2, "run.concurrency": 4}
    )
    raw = await play_profile(driver, profile, run_id="t")
    assert driver.most_held <= 4 and sum(driver.acquires) == 20 and driver.held == 0
    assert raw["episodes"]["completed"] == 20


@pytest.mark.timeout(20)
async def test_bounds_end_the_run_and_everything_is_released() -> None:
    driver = MemoryDriver()
    raw = await play_profile(driver, fake_profile(**{"run.max_requests": 25}), run_id="t")
    assert raw["stopped_by"] == "max_requests"
    assert raw["requests"] <= 25 + driver.releases  # releases are cleanup, never refused
    assert driver.held == 0
    assert raw["episodes"]["cut_by_bounds"] > 0

    driver = MemoryDriver()
    slow = fake_profile(**{"episode.think_seconds": 30.0, "run.max_seconds": 0.2})
    raw = await play_profile(driver, slow, run_id="t")
    assert raw["stopped_by"] == "max_seconds" and raw["wall_s"] < 5 and driver.held == 0


@pytest.mark.timeout(20)
async def test_a_failing_command_is_a_typed_error() -> None:
    driver = MemoryDriver(fail_command="pwd")
    raw = await play_profile(driver, fake_profile(), run_id="t")
    assert set(raw["errors"]) == {"exec:EXIT_NONZERO"}


# -- the floor: plain processes on the host ----------------------------------------


@pytest.mark.timeout(30)
async def test_episodes_run_on_the_floor_without_errors_or_leaks() -> None:
    profile = fake_profile(**{"episode.snapshot_probability": 0.3})
    driver = FloorDriver(snapshots=True)
    await driver.setup(10.0)
    try:
        raw = await play_profile(driver, profile, run_id="t")
    finally:
        down = await driver.teardown()
    assert raw["errors"] == {}, raw["error_samples"]
    assert raw["episodes"] == {"planned": 12, "completed": 12, "failed": 0, "cut_by_bounds": 0}
    plans: list[Plan] = [plan_episode(profile, r, s) for s in range(2) for r in range(6)]
    assert raw["latency_ms"]["exec"]["n"] == sum(p.execs for p in plans)
    assert raw["latency_ms"]["snapshot"]["n"] == sum(t.snapshot for p in plans for t in p.turns)
    assert down == {"leaked": 0, "leftovers": []} and not driver.root.exists()


@pytest.mark.timeout(30)
async def test_floor_sessions_keep_their_state_and_one_shots_do_not() -> None:
    driver = FloorDriver()
    await driver.setup(10.0)
    try:
        (box,) = await driver.acquire(1, {})
        assert isinstance(box, FloorBox)
        await driver.write(box, [("src/a.py", b"print(1)\n")])

        async def run(command: str, session: bool = True, timeout: float = 10.0) -> ExecOutcome:
            return await driver.exec(box, command, session=session, timeout=timeout)

        assert (await run("cd /workspace/src && export X=7")).exit_code == 0
        assert (await run('test "$X" = 7 && test -f a.py && python3 a.py')).exit_code == 0
        assert (await run('test -z "$X" && test -f src/a.py', session=False)).exit_code == 0
        failed = await run("echo oops >&2; false")
        assert failed == ExecOutcome("EXITED", 1, b"oops\n")
        assert (await run("sleep 30", timeout=0.3)).outcome == "TIMED_OUT"
        assert (await run("sleep 30", session=False, timeout=0.3)).outcome == "TIMED_OUT"
        assert (await run('test -z "$X"')).exit_code == 0  # a new session after the timeout
        await driver.release([box])
        assert not box.path.exists() and box.shell is None and driver.live == 0
    finally:
        down = await driver.teardown()
    assert down["leaked"] == 0


# -- the leak check -------------------------------------------------------------------


@dataclass
class FakeContainer:
    name: str
    status: str
    labels: dict[str, str]


@pytest.mark.timeout(10)
def test_leftovers_are_the_containers_with_the_run_label() -> None:
    containers = [
        FakeContainer("a", "running", {"sandboxd.instance": "load-1"}),
        FakeContainer("b", "exited", {"sandboxd.instance": "load-2"}),
        FakeContainer("c", "created", {"sandboxd.instance": "load-1", "x": "y"}),
        FakeContainer("d", "running", {}),
    ]
    assert leftovers(containers, "sandboxd.instance", "load-1") == [
        {"name": "a", "status": "running"},
        {"name": "c", "status": "created"},
    ]
    assert leftovers(containers, "sandboxd.instance", "load-3") == []


@pytest.fixture
async def app() -> AsyncIterator[App]:
    app = build_app(make_settings(), backend=FakeBackend(), persist=False)
    await app.start()
    try:
        yield app
    finally:
        await app.stop(grace=0.5)


@pytest.mark.timeout(20)
async def test_leased_sandboxes_of_the_run_are_leaks(app: App) -> None:
    async with AsyncClient(app.address) as client:
        await client.create_pool("p", IMAGE, min_ready=0, max_size=4)
        lease = await client.lease("p", 2, labels={"load-run": "r1"}, timeout=5)
        other = await client.lease("p", 1, labels={"load-run": "r2"}, timeout=5)
        assert len(await leased_leftovers(client, "r1")) == 2
        await lease.release()
        assert await leased_leftovers(client, "r1") == []
        await other.release()


# -- the sandboxd driver against an in-process server (fake backend) -----------------------


async def run_sandboxd(app: App, profile: Profile, **kw: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    driver = SandboxdDriver(
        run_id="unit", image=IMAGE, min_ready=profile.run.in_flight, max_size=profile.run.in_flight,
        target=app.address, **kw,
    )  # fmt: skip
    sampler = Sampler(driver, interval=0.05)
    setup = await driver.setup(warm_timeout=10)
    sampler.start()
    try:
        raw = await play_profile(driver, profile, run_id="unit", sampler=sampler)
    finally:
        await sampler.stop()
        raw_teardown = await driver.teardown()
    raw["setup"] = setup
    raw["timeline"] = sampler.timeline()
    return raw, raw_teardown


@pytest.mark.timeout(30)
async def test_episodes_run_on_sandboxd_without_errors_or_leaks(app: App) -> None:
    profile = fake_profile(**{"episode.snapshot_probability": 0.3})
    raw, down = await run_sandboxd(app, profile)
    assert raw["errors"] == {}, raw["error_samples"]
    assert raw["episodes"] == {"planned": 12, "completed": 12, "failed": 0, "cut_by_bounds": 0}
    plans: list[Plan] = [plan_episode(profile, r, s) for s in range(2) for r in range(6)]
    assert raw["latency_ms"]["exec"]["n"] == sum(p.execs for p in plans)
    assert raw["latency_ms"]["acquire"]["n"] == 4 and raw["latency_ms"]["release"]["n"] == 4
    assert raw["setup"]["min_ready"] == 6
    assert down["leaked"] == 0 and "delete_pool_error" not in down
    assert app.control.pools == {}  # the harness deleted its pool


@pytest.mark.timeout(30)
async def test_refill_between_steps_holds_the_pool_during_a_step(app: App) -> None:
    profile = fake_profile(**{"run.refill": "between-steps", "run.steps": 3, "run.step_gap_seconds": 0.0})
    raw, down = await run_sandboxd(app, profile)
    assert raw["errors"] == {}, raw["error_samples"]
    assert raw["latency_ms"]["hold_refill"]["n"] == 3  # once per step, when every group holds its sandboxes
    assert raw["latency_ms"]["refill"]["n"] == 2  # between steps: floor restored, pool warm again
    assert len(raw["between_steps_s"]) == 2 and len(raw["step_s"]) == 3
    assert down["leaked"] == 0


@pytest.mark.timeout(30)
async def test_rpc_errors_are_typed_by_status_code(app: App) -> None:
    async with AsyncClient(app.address) as client:
        await client.create_pool("tiny", IMAGE, min_ready=0, max_size=1)
    # Groups of 3 from a pool of at most 1: FAILED_PRECONDITION, never satisfiable.
    driver = SandboxdDriver(
        run_id="u2", image=IMAGE, min_ready=0, max_size=1, target=app.address, pool="tiny"
    )
    await driver.setup(warm_timeout=5)
    try:
        raw = await play_profile(driver, fake_profile(), run_id="u2")
    finally:
        await driver.teardown()
    assert raw["errors"] == {"grpc:FAILED_PRECONDITION": 4}
    assert raw["episodes"]["failed"] == 12


@pytest.mark.timeout(20)
async def test_snapshot_support_is_detected_not_assumed(app: App) -> None:
    from benchmarks.load import snapshots

    method, note = await asyncio.to_thread(snapshots.discover, app.address)
    if method is None:
        assert "no snapshot RPC" in note
    else:
        assert method.path.endswith("Snapshot") and "sandbox_id" in method.fields


# -- reports, compare, loopback --------------------------------------------------------


def _driver_result(step: float, p99: float) -> dict[str, Any]:
    return {
        "step_s": [step, step],
        "latency_ms": {"exec": {"n": 2, "p50": p99 / 2, "p99": p99}},
        "errors": {},
        "leaked": 0,
        "episodes": {"completed": 2, "planned": 2},
    }


@pytest.mark.timeout(10)
def test_report_has_the_headline_keys(tmp_path: Path) -> None:
    report = build_report(
        {"profile": "x", "rollouts": 2},
        {
            "sandboxd": _driver_result(2.0, 5.0),
            "baseline": _driver_result(8.0, 50.0),
            "floor": _driver_result(1.6, 2.0),
        },
    )
    for key in (
        "sandboxd_step_s",
        "baseline_step_s",
        "floor_step_s",
        "sandboxd_exec_p99_ms",
        "baseline_exec_p99_ms",
        "errors",
        "leaked",
    ):
        assert key in report
    assert report["speedup"] == 4.0 and report["sandboxd_over_floor"] == 1.25
    assert report["goals"]["sandboxd_over_floor"]["met"] is False  # over the 1.2x goal
    assert report["goals_met"] is False
    assert "4.00x shorter" in render(report) and "1.25x the floor" in render(report)
    report["drivers"]["floor"]["step_s"] = [1.8]
    report = build_report({"profile": "x", "rollouts": 2}, report["drivers"])
    assert report["goals"]["sandboxd_over_floor"]["met"] is True and report["goals_met"] is True
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(report))
    report["drivers"]["sandboxd"]["step_s"] = [1.0]
    b.write_text(json.dumps(build_report({"profile": "x"}, report["drivers"])))
    text = compare(a, b)
    assert "A: a.json" in text and "0.50x" in text


@pytest.mark.timeout(10)
def test_compare_subcommand(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "r.json"
    path.write_text(json.dumps(build_report({"profile": "x"}, {"sandboxd": _driver_result(1.0, 2.0)})))
    assert cli.main(["compare", str(path), str(path)]) == 0
    assert "sandboxd" in capsys.readouterr().out


@pytest.mark.timeout(10)
def test_only_loopback_is_talked_to() -> None:
    assert (
        cli.is_loopback_host("127.0.0.1")
        and cli.is_loopback_host("localhost")
        and cli.is_loopback_host("::1")
    )
    assert not cli.is_loopback_host("10.1.2.3")
    cli.check_target("127.0.0.1:50051", allow_remote=False)
    with pytest.raises(SystemExit, match="not a loopback"):
        cli.check_target("10.1.2.3:50051", allow_remote=False)
    cli.check_target("10.1.2.3:50051", allow_remote=True)


@pytest.mark.timeout(10)
def test_sandboxd_bench_delegates_to_the_harness(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from sandboxd import cli as sandboxd_cli

    path = tmp_path / "r.json"
    path.write_text(json.dumps(build_report({"profile": "x"}, {"sandboxd": _driver_result(1.0, 2.0)})))
    assert sandboxd_cli.main(["bench", "compare", str(path), str(path)]) == 0
    assert "A: r.json" in capsys.readouterr().out


@pytest.mark.timeout(60)
def test_plots_are_drawn_from_a_result(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from benchmarks.load.plots import step_windows

    timeline = [{"t": float(t), "ready": t, "demand": 2 * t} for t in range(-2, 5)]
    series = {
        "sandboxd": {
            "samples_ms": {"exec_session": [1.0, 2.0, 30.0]},
            "timeline": timeline,
            "step_s": [1.0, 2.0],
        },
        "baseline": {"samples_ms": {"exec_session": [9.0, 90.0]}, "timeline": [], "step_s": [3.0]},
    }
    (tmp_path / "r.json").write_text(json.dumps({"profile": "x", "rollouts": 2, "drivers": {}}))
    (tmp_path / "r.series.json").write_text(json.dumps(series))
    assert [Path(p).name for p in cli.replot(tmp_path / "r.json")] == ["r_latency_cdf.png", "r_pool.png"]
    assert (tmp_path / "r_pool.png").stat().st_size > 0
    assert step_windows({"step_s": [1.0, 2.0], "between_steps_s": [5.0]}) == [(0.0, 1.0), (6.0, 2.0)]
    assert step_windows({"step_s": [1.0], "step_start_s": [0.5]}) == [(0.5, 1.0)]
