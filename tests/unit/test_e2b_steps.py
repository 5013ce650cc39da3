"""E2B template build steps as the Dockerfile sandboxd builds, and a build
failure traced back to the E2B step that made it."""

from __future__ import annotations

import pytest

from sandboxd.e2b.steps import StepError, docker_user, failed_step, translate

HASH = "ab" * 32


def test_steps_become_a_dockerfile_with_sandboxd_users() -> None:
    spec = {
        "fromImage": "python:3.12-slim",
        "steps": [
            {"type": "COPY", "args": ["src/", "/app/", "user", "0755"], "filesHash": HASH},
            {"type": "ENV", "args": ["A", 'say "$HOME"', "B", "2"]},
            {"type": "USER", "args": ["user"]},
            {"type": "RUN", "args": ["pip list", "root"]},
            {"type": "WORKDIR", "args": ["/app"]},
            {"type": "RUN", "args": ["echo a\necho b"]},
        ],
        "startCmd": "serve",
        "readyCmd": "true",
    }
    out = translate(spec, "python:3.12-slim")
    assert out.dockerfile.splitlines() == [
        "FROM python:3.12-slim",
        f'COPY --chown=1000:1000 --chmod=0755 ["files/{HASH}/src", "/app/"]',
        'ENV A="say \\"\\$HOME\\"" B="2"',
        "USER 1000:1000",
        "USER root",
        'RUN ["/bin/sh", "-c", "pip list"]',
        "USER 1000:1000",
        "WORKDIR /app",
        'RUN ["/bin/sh", "-c", "echo a\\necho b"]',
    ]
    assert out.copies == {HASH: "1"}
    assert (out.user, out.workdir, out.start_cmd, out.ready_cmd) == ("user", "/app", "serve", "true")
    assert [docker_user(u) for u in ("root", "user", "postgres", "user:root", "0:0")] == [
        "root",
        "1000:1000",
        "1000:1000",
        "1000:root",
        "root:root",
    ]


def test_failures_name_the_e2b_step() -> None:
    out = translate(
        {
            "steps": [
                {"type": "RUN", "args": ["true"]},
                {"type": "ENV", "args": ["A", "1"]},
                {"type": "RUN", "args": ["false"]},
            ]
        },
        "debian:12",
    )
    # BuildKit's vertex names, and the classic builder's Dockerfile lines.
    assert failed_step(out, "[3/3] RUN /bin/sh -c false") == "3"
    assert failed_step(out, 'RUN ["/bin/sh", "-c", "false"]') == "3"
    assert failed_step(out, "[2/3] RUN /bin/sh -c true") == "1"
    assert failed_step(out, "[1/3] FROM docker.io/library/debian:12") == "base"
    assert failed_step(out, "") == "base"


@pytest.mark.parametrize(
    ("spec", "step"),
    [
        ({"steps": [{"type": "RUN", "args": []}]}, "1"),
        ({"steps": [{"type": "ENV", "args": ["A"]}]}, "1"),
        ({"steps": [{"type": "ENV", "args": ["1A", "x"]}]}, "1"),
        ({"steps": [{"type": "ENV", "args": ["A", "x\ny"]}]}, "1"),
        (
            {
                "steps": [
                    {"type": "RUN", "args": ["true"]},
                    {"type": "COPY", "args": ["/abs", "/x"], "filesHash": HASH},
                ]
            },
            "2",
        ),
        ({"steps": [{"type": "COPY", "args": ["a", "/x", "", "rwx"], "filesHash": HASH}]}, "1"),
        ({"steps": [{"type": "COPY", "args": ["a", "/x"]}]}, "1"),
        ({"steps": [{"type": "USER", "args": [""]}]}, "1"),
        ({"steps": "RUN x"}, "base"),
        ({"startCmd": 5}, "finalize"),
    ],
)
def test_bad_steps_are_refused_naming_them(spec: dict[str, object], step: str) -> None:
    with pytest.raises(StepError) as refused:
        translate(spec, "debian:12")
    assert refused.value.step == step
