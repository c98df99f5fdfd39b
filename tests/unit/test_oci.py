"""devtools/oci.py on a small tree: same bytes from the same tree whatever its times, layers split by the
longest prefix, links kept, and what it writes unpacks back (the image build's heavy test is
tests/integration/test_image.py)."""

from __future__ import annotations

import json
import os
import re
import tarfile
from pathlib import Path

import pytest

from devtools import oci

EPOCH = 1_790_000_000
LAYERS = [oci.Layer("base", ("",), epoch=EPOCH - 1000), oci.Layer("app", ("opt/app", "usr/bin/app"))]
CONFIG = {"User": "65532:65532", "Entrypoint": ["/usr/bin/app"]}


def make_tree(root: Path, mtime: float) -> None:
    (root / "usr" / "bin").mkdir(parents=True)
    (root / "opt" / "app" / "lib").mkdir(parents=True)
    (root / "dev").mkdir()
    (root / "dev" / "null-ish").write_text("a runtime's business, not the image's")
    (root / "usr" / "bin" / "app").write_text("#!/bin/sh\necho app\n")
    (root / "usr" / "bin" / "app").chmod(0o755)
    (root / "usr" / "bin" / "tool").write_text("tool\n")
    os.link(root / "usr" / "bin" / "tool", root / "usr" / "bin" / "tool2")
    (root / "usr" / "bin" / "sh").symlink_to("dash")
    (root / "opt" / "app" / "lib" / "mod.py").write_text("x = 1\n")
    (root / "old").write_text("older than the epoch: keeps its time\n")
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            os.utime(Path(dirpath) / name, (mtime, mtime), follow_symlinks=False)
    os.utime(root / "old", (EPOCH - 5000, EPOCH - 5000))


def build(tmp: Path, name: str, mtime: float) -> oci.Image:
    tree = tmp / name / "root"
    tree.mkdir(parents=True)
    make_tree(tree, mtime)
    image = oci.build(
        tree, tmp / name / "layout", layers=LAYERS, epoch=EPOCH, config=CONFIG, annotations={}, ref_name="1"
    )
    oci.archive(tmp / name / "layout", tmp / name / "image.tar", EPOCH)
    return image


def members(tmp: Path, name: str, blob: oci.Blob) -> dict[str, tarfile.TarInfo]:
    path = tmp / name / "layout" / "blobs" / "sha256" / blob.digest.removeprefix("sha256:")
    with tarfile.open(path) as tar:
        return {m.name: m for m in tar.getmembers()}


def test_the_same_tree_built_at_different_times_gives_the_same_bytes(tmp_path: Path) -> None:
    first = build(tmp_path, "a", EPOCH + 100)
    second = build(tmp_path, "b", EPOCH + 99_999)
    assert first == second
    assert (tmp_path / "a" / "image.tar").read_bytes() == (tmp_path / "b" / "image.tar").read_bytes()


def test_layers_split_by_the_longest_prefix_with_times_clamped_and_links_kept(tmp_path: Path) -> None:
    image = build(tmp_path, "a", EPOCH + 100)
    base, app = (members(tmp_path, "a", b) for b in image.layers)
    assert sorted(app) == ["opt/app", "opt/app/lib", "opt/app/lib/mod.py", "usr/bin/app"]
    assert "opt" in base and "usr/bin/tool" in base and "opt/app" not in base
    assert "dev" in base and "dev/null-ish" not in base
    assert base["usr/bin/sh"].issym() and base["usr/bin/sh"].linkname == "dash"
    assert base["usr/bin/tool2"].islnk() and base["usr/bin/tool2"].linkname == "usr/bin/tool"
    assert base["old"].mtime == EPOCH - 5000  # older than the layer's epoch: kept
    assert base["usr/bin/tool"].mtime == EPOCH - 1000  # the base layer's own epoch
    assert app["usr/bin/app"].mtime == EPOCH and app["usr/bin/app"].mode == 0o755
    assert {m.uname for m in base.values()} == {""}


def test_the_archive_unpacks_to_the_tree_and_its_config(tmp_path: Path) -> None:
    image = build(tmp_path, "a", EPOCH + 100)
    index = json.loads((tmp_path / "a" / "layout" / "index.json").read_text())
    assert index["manifests"][0]["digest"] == image.manifest.digest
    config = oci.unpack(tmp_path / "a" / "image.tar", tmp_path / "out")
    assert config == CONFIG
    assert (tmp_path / "out" / "usr" / "bin" / "app").read_text() == "#!/bin/sh\necho app\n"
    assert os.readlink(tmp_path / "out" / "usr" / "bin" / "sh") == "dash"
    assert (tmp_path / "out" / "usr" / "bin" / "tool2").stat().st_ino == (
        tmp_path / "out" / "usr" / "bin" / "tool"
    ).stat().st_ino
    argv = oci.chroot_argv(tmp_path / "out", config, ["--help"])
    assert argv[-2:] == ["/usr/bin/app", "--help"]
    assert "exec chroot --userspec=65532:65532" in argv[argv.index("-c") + 1]


def test_layers_on_a_base_image_reuse_its_layers_and_merge_its_config(tmp_path: Path) -> None:
    base = build(tmp_path, "a", EPOCH + 100)
    extra = tmp_path / "extra"
    (extra / "opt" / "app" / "lib" / "plugin").mkdir(parents=True)
    (extra / "opt" / "app" / "lib" / "plugin" / "mod.py").write_text("y = 2\n")

    def on_base(name: str) -> oci.Image:
        return oci.build(
            extra, tmp_path / name, layers=[oci.Layer("plugin", ("opt",))], epoch=EPOCH,
            config={"Labels": {"title": "app-plugin"}}, annotations={"title": "app-plugin"}, ref_name="1",
            base=tmp_path / "a" / "layout",
        )  # fmt: skip

    image = on_base("plugin")
    assert image == on_base("again")
    assert image.layers[:2] == base.layers and len(image.layers) == 3
    assert image.names == ("base", "app", "plugin")
    assert image.unpacked == base.unpacked + image.layers[2].unpacked
    oci.archive(tmp_path / "plugin", tmp_path / "plugin.tar", EPOCH)
    config = oci.unpack(tmp_path / "plugin.tar", tmp_path / "out")
    assert config == {**CONFIG, "Labels": {"title": "app-plugin"}}
    assert (tmp_path / "out" / "opt" / "app" / "lib" / "mod.py").read_text() == "x = 1\n"
    assert (tmp_path / "out" / "opt" / "app" / "lib" / "plugin" / "mod.py").read_text() == "y = 2\n"


def arch_image(tmp: Path, arch: str) -> Path:
    """A one-image layout of `arch` whose only file names its architecture."""
    tree = tmp / arch / "root"
    (tree / "etc").mkdir(parents=True)
    (tree / "etc" / "arch").write_text(f"{arch}\n")
    layout = tmp / arch / "layout"
    oci.build(tree, layout, layers=[oci.Layer("base", ("",))], epoch=EPOCH, config=CONFIG, annotations={},
              ref_name="1", architecture=arch)  # fmt: skip
    return layout


def test_an_index_holds_one_image_per_architecture_and_each_is_picked_by_its_platform(tmp_path: Path) -> None:
    layouts = [arch_image(tmp_path, arch) for arch in ("amd64", "arm64")]
    first = oci.index(layouts, tmp_path / "index", ref_name="1", annotations={"a": "b"})
    again = oci.index(layouts, tmp_path / "again", ref_name="1", annotations={"a": "b"})
    assert first == again  # same images, same index
    blobs = tmp_path / "index" / "blobs" / "sha256"
    top = json.loads((tmp_path / "index" / "index.json").read_text())
    assert [(d["mediaType"], d["digest"]) for d in top["manifests"]] == [(oci.INDEX_TYPE, first.digest)]
    image_index = json.loads((blobs / first.digest.removeprefix("sha256:")).read_text())
    platforms = [d["platform"] for d in image_index["manifests"]]
    assert platforms == [{"architecture": "amd64", "os": "linux"},
                         {"architecture": "arm64", "os": "linux", "variant": "v8"}]  # fmt: skip
    for d, layout in zip(image_index["manifests"], layouts, strict=True):
        assert d["digest"] == json.loads((layout / "index.json").read_text())["manifests"][0]["digest"]
    oci.archive(tmp_path / "index", tmp_path / "index.tar", EPOCH)
    for arch in ("amd64", "arm64"):
        config = oci.unpack(tmp_path / "index.tar", tmp_path / f"out-{arch}", arch)
        assert config["Entrypoint"] == CONFIG["Entrypoint"]
        assert (tmp_path / f"out-{arch}" / "etc" / "arch").read_text() == f"{arch}\n"
        _, image_config = oci._read_base(tmp_path / "index", arch)  # what an image on top reads
        assert image_config["architecture"] == arch
    with pytest.raises(LookupError, match=re.escape("no riscv64 image in the index (it has: amd64, arm64)")):
        oci.unpack(tmp_path / "index.tar", tmp_path / "none", "riscv64")


def test_an_index_refuses_two_images_of_one_architecture(tmp_path: Path) -> None:
    amd64 = arch_image(tmp_path, "amd64")
    with pytest.raises(ValueError, match=r"two images for .*amd64"):
        oci.index([amd64, amd64], tmp_path / "index", ref_name="1", annotations={})
