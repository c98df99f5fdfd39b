"""requirements/image.lock, what the image installs with --require-hashes --no-deps, keeps up with pyproject
(and requirements/analyzer.lock, the anomaly extra's layer of the analyzer image, with its extra).

Offline: it compares the lock with pyproject's runtime dependencies and the nvml extra (the image's
set), so it cannot change with what PyPI publishes. A failure means: run `make lock`. That the lock is
also complete (every dependency of a locked package locked too) is proven by `pip check` in the image
build.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
LOCK = ROOT / "requirements" / "image.lock"
ANALYZER_LOCK = ROOT / "requirements" / "analyzer.lock"
# The image's interpreter: Debian 12's CPython 3.11 on x86_64 Linux (markers are evaluated for it).
IMAGE_ENV = {
    "python_version": "3.11",
    "python_full_version": "3.11.2",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
    "os_name": "posix",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
    "extra": "",
}
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)")


def parse_lock(text: str) -> dict[str, tuple[Version, int]]:
    """{canonical name: (pinned version, number of hashes)} from a pip requirements file with hashes."""
    pins: dict[str, tuple[Version, int]] = {}
    current = ""
    for line in text.splitlines():
        if m := PIN.match(line):
            current = canonicalize_name(m[1])
            assert current not in pins, f"{current} pinned twice"
            pins[current] = (Version(m[2]), 0)
        elif line.strip().startswith("--hash=sha256:") and current:
            version, hashes = pins[current]
            pins[current] = (version, hashes + 1)
        elif line.strip() and not line.lstrip().startswith("#"):
            assert line.startswith("    "), f"not a pin, hash or comment: {line!r}"
    return pins


def image_requirements() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = [Requirement(r) for r in project["dependencies"] + project["optional-dependencies"]["nvml"]]
    return [r for r in reqs if r.marker is None or r.marker.evaluate(IMAGE_ENV)]


def unsatisfied(pins: dict[str, tuple[Version, int]], reqs: list[Requirement]) -> list[str]:
    problems = []
    for req in reqs:
        name = canonicalize_name(req.name)
        if name not in pins:
            problems.append(f"{req}: not in the lock")
        elif not req.specifier.contains(pins[name][0], prereleases=True):
            problems.append(f"{req}: the lock has {pins[name][0]}")
    return problems


def test_every_runtime_dependency_is_locked_at_a_version_pyproject_accepts() -> None:
    pins = parse_lock(LOCK.read_text())
    assert unsatisfied(pins, image_requirements()) == [], "run `make lock`"


def test_every_pin_carries_hashes() -> None:
    pins = parse_lock(LOCK.read_text())
    assert len(pins) > 20
    assert [name for name, (_, hashes) in pins.items() if hashes == 0] == []


def test_the_analyzer_lock_holds_the_anomaly_extra_and_nothing_the_image_has() -> None:
    """requirements/analyzer.lock (the analyzer image's layer, image/analyzer.sh) on top of the image's."""
    pins = parse_lock(ANALYZER_LOCK.read_text())
    extra = [Requirement(r) for r in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]["anomaly"]]  # fmt: skip
    assert unsatisfied(pins, extra) == [], "run `make lock`"
    assert [name for name, (_, hashes) in pins.items() if hashes == 0] == []
    assert sorted(set(pins) & set(parse_lock(LOCK.read_text()))) == []


@pytest.mark.parametrize(
    ("requirement", "problem"),
    [
        ("pydantic>=2.7,<3", None),
        ("pydantic>=3", "the lock has 2.14.4"),
        ("kubernetes==37.0.2", None),
        ("kubernetes==38.0.0", "the lock has 37.0.2"),
        ("not-locked-anywhere>=1", "not in the lock"),
    ],
)
def test_the_check_itself(requirement: str, problem: str | None) -> None:
    pins = parse_lock(
        "pydantic==2.14.4 \\\n    --hash=sha256:aa\n    # via faultline\n"
        "kubernetes==37.0.2 \\\n    --hash=sha256:bb \\\n    --hash=sha256:cc\n"
    )
    assert pins["kubernetes"] == (Version("37.0.2"), 2)
    found = unsatisfied(pins, [Requirement(requirement)])
    assert found == ([] if problem is None else [f"{requirement}: {problem}"])
