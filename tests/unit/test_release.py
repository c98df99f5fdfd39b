"""devtools/release.py: a release's chart names its version and its images by digest, comments kept, and
refuses a version Helm cannot take, a registry that is not one, or a digest that was never built."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from devtools import release

CHART = Path(__file__).resolve().parents[2] / "charts" / "faultline"
DIGESTS = {name: "sha256:" + c * 64 for name, c in (("faultline", "a"), ("ferretdb", "b"), ("postgres", "c"))}


def copy(tmp_path: Path) -> Path:
    chart = tmp_path / "faultline"
    shutil.copytree(CHART, chart, symlinks=False)
    return chart


def test_the_chart_names_the_release_and_its_images(tmp_path: Path) -> None:
    chart = copy(tmp_path)
    before = (chart / "values.yaml").read_text().splitlines()
    release.stamp(chart, version="1.2.0-rc.1", registry="reg.example:5000/team", digests=DIGESTS)
    meta = yaml.safe_load((chart / "Chart.yaml").read_text())
    assert (meta["version"], meta["appVersion"]) == ("1.2.0-rc.1", "1.2.0-rc.1")
    values = yaml.safe_load((chart / "values.yaml").read_text())
    assert values["image"]["repository"] == "reg.example:5000/team/images/faultline"
    assert values["image"]["digest"] == DIGESTS["faultline"]
    for name in ("ferretdb", "postgres"):
        image = values["store"]["embedded"][name]["image"]
        assert (image["repository"], image["digest"]) == (
            f"reg.example:5000/team/images/{name}",
            DIGESTS[name],
        )
    after = (chart / "values.yaml").read_text().splitlines()
    changed = [(b, a) for b, a in zip(before, after, strict=True) if b != a]
    assert len(changed) == 6  # three repositories, three digests; every comment stays
    assert all("#" not in b or "#" in a for b, a in changed)


@pytest.mark.parametrize(
    ("version", "registry", "digests", "error"),
    [
        ("v1.2", "reg:5000", DIGESTS, "not a SemVer version"),
        ("1.2.0", "", DIGESTS, "is not host[:port][/path]"),
        ("1.2.0", "reg:5000", {**DIGESTS, "postgres": ""}, "the postgres digest '' is not sha256"),
    ],
)
def test_what_a_release_cannot_be_is_refused_before_anything_changes(
    tmp_path: Path, version: str, registry: str, digests: dict[str, str], error: str
) -> None:
    chart = copy(tmp_path)
    before = {p.name: p.read_text() for p in (chart / "Chart.yaml", chart / "values.yaml")}
    with pytest.raises(release.ReleaseError, match=error.replace("[", r"\[").replace("]", r"\]")):
        release.stamp(chart, version=version, registry=registry, digests=digests)
    assert {p.name: p.read_text() for p in (chart / "Chart.yaml", chart / "values.yaml")} == before
