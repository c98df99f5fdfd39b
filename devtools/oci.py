"""A reproducible OCI image from a root filesystem directory: layer tars, config, manifest, index, archive.

`make image` builds the root filesystem with mmdebstrap (image/build.sh) and hands it to `build()`, which
writes an OCI image layout (a directory, what crane pushes) and the same layout as one tar (the OCI
archive, what syft scans and what is kept). Same input tree and epoch, same bytes:

- entries are written in sorted path order, parents first; owner and group are numeric (no user or group
  names, which would come from the build host), modes as on disk;
- every mtime is clamped to the epoch (the last commit's time, or a layer's own: image/build.sh gives
  the Debian and dependency layers the time of the last commit that changed the image's recipe or the
  lock, so an ordinary commit leaves them as they were): files from Debian packages keep their older
  package times, so the timestamp-based `.pyc` files Debian compiles stay valid; anything made during
  the build gets the epoch;
- gzip with mtime 0 and no file name; JSON with sorted keys and no spaces; the archive's own entries are
  sorted and owned by root with the epoch as mtime.

The tree is split into layers by path prefix (the longest matching prefix wins), so the Debian base,
the locked dependencies and the project's own files are separate blobs: a change to the project alone
changes only its small layer. Device nodes, sockets and FIFOs are left out (the runtime provides /dev),
and so is the content of /dev, /proc, /sys and /run.

With a `base` layout (`make image-analyzer`: the product image plus the anomaly extra), the tree's
layers go on top of the base image's, which are reused blob for blob; the base's config and
annotations are kept, with what is given over them (labels merged). The tree then holds only what the
new layers add, with its parent directories (as the base has them: root's, 0755).

Why our own writer rather than buildah: about 200 lines with nothing to install, no storage driver, and
every byte decided here (buildah's output also depends on its version and storage configuration).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import gzip
import hashlib
import json
import os
import shutil
import stat
import sys
import tarfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO, Any

MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"
CONFIG_TYPE = "application/vnd.oci.image.config.v1+json"
LAYER_TYPE = "application/vnd.oci.image.layer.v1.tar+gzip"
INDEX_TYPE = "application/vnd.oci.image.index.v1+json"
EMPTY_DIRS = ("dev", "proc", "sys", "run")  # kept as empty directories: the runtime mounts them
GZIP_LEVEL = 6  # gzip's own default: level 9 costs about twice the time on 2 cores for ~1% smaller blobs
CHUNK = 1 << 20


@dataclasses.dataclass(frozen=True)
class Layer:
    """One layer: the paths (relative to the root, no leading slash) under any of `prefixes`; a path
    under the prefixes of several layers goes to the longest prefix. An empty prefix matches all."""

    name: str
    prefixes: tuple[str, ...]
    epoch: int | None = None  # its newest mtime (default: the image's epoch)


@dataclasses.dataclass(frozen=True)
class Blob:
    digest: str  # "sha256:<hex>" of the stored bytes
    size: int
    diff_id: str = ""  # layers: sha256 of the uncompressed tar
    unpacked: int = 0  # layers: the uncompressed tar's size in bytes


@dataclasses.dataclass(frozen=True)
class Image:
    manifest: Blob  # the image digest is manifest.digest
    config: Blob
    layers: tuple[Blob, ...]
    names: tuple[str, ...]

    @property
    def unpacked(self) -> int:
        return sum(b.unpacked for b in self.layers)

    @property
    def compressed(self) -> int:
        return sum(b.size for b in self.layers)


class _Hashing:
    """A write-only file object that hashes and counts what passes through to `inner`."""

    def __init__(self, inner: IO[bytes]) -> None:
        self.inner = inner
        self.sha = hashlib.sha256()
        self.size = 0

    def write(self, data: bytes) -> int:
        self.sha.update(data)
        self.size += len(data)
        return self.inner.write(data)

    def flush(self) -> None:
        self.inner.flush()


def _matches(rel: str, prefix: str) -> bool:
    return not prefix or rel == prefix or rel.startswith(prefix.rstrip("/") + "/")


def _owner(rel: str, layers: Sequence[Layer]) -> int:
    """The layer with the longest prefix that matches `rel` (-1: none)."""
    best, best_len = -1, -1
    for i, layer in enumerate(layers):
        for p in layer.prefixes:
            if _matches(rel, p) and len(p) > best_len:
                best, best_len = i, len(p)
    return best


def _walk(root: Path) -> Iterator[tuple[str, os.stat_result]]:
    """Every path under root (relative, sorted, parents before their children) with its lstat."""

    def walk(directory: Path, rel: str) -> Iterator[tuple[str, os.stat_result]]:
        for name in sorted(os.listdir(directory)):
            path = directory / name
            sub = f"{rel}/{name}" if rel else name
            st = path.lstat()
            yield sub, st
            if stat.S_ISDIR(st.st_mode) and not (not rel and name in EMPTY_DIRS):
                yield from walk(path, sub)

    yield from walk(root, "")


def _tarinfo(root: Path, rel: str, st: os.stat_result, epoch: int) -> tarfile.TarInfo | None:
    info = tarfile.TarInfo(rel)
    info.mode = stat.S_IMODE(st.st_mode)
    info.uid, info.gid = st.st_uid, st.st_gid
    info.uname = info.gname = ""
    info.mtime = min(int(st.st_mtime), epoch)
    if stat.S_ISDIR(st.st_mode):
        info.type = tarfile.DIRTYPE
    elif stat.S_ISLNK(st.st_mode):
        info.type = tarfile.SYMTYPE
        info.linkname = os.readlink(root / rel)
    elif stat.S_ISREG(st.st_mode):
        info.type = tarfile.REGTYPE
        info.size = st.st_size
    else:
        return None  # devices, FIFOs, sockets: not image content
    return info


def _write_layer(root: Path, rels: Sequence[tuple[str, os.stat_result]], epoch: int, out: Path) -> Blob:
    with out.open("wb") as raw:
        packed = _Hashing(raw)
        with gzip.GzipFile(filename="", mode="wb", fileobj=packed, mtime=0, compresslevel=GZIP_LEVEL) as gz:
            plain = _Hashing(gz)  # type: ignore[arg-type]
            with tarfile.open(fileobj=plain, mode="w|", format=tarfile.PAX_FORMAT) as tar:  # type: ignore[call-overload]
                seen: dict[tuple[int, int], str] = {}  # hard links within the layer
                for rel, st in rels:
                    info = _tarinfo(root, rel, st, epoch)
                    if info is None:
                        continue
                    key = (st.st_dev, st.st_ino)
                    if info.type == tarfile.REGTYPE and st.st_nlink > 1:
                        if key in seen:
                            info.type, info.linkname, info.size = tarfile.LNKTYPE, seen[key], 0
                            tar.addfile(info)
                            continue
                        seen[key] = rel
                    if info.type == tarfile.REGTYPE:
                        with (root / rel).open("rb") as f:
                            tar.addfile(info, f)
                    else:
                        tar.addfile(info)
    digest = packed.sha.hexdigest()
    return Blob(f"sha256:{digest}", packed.size, f"sha256:{plain.sha.hexdigest()}", plain.size)


def _json(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def _put(blobs: Path, data: bytes) -> Blob:
    digest = hashlib.sha256(data).hexdigest()
    (blobs / digest).write_bytes(data)
    return Blob(f"sha256:{digest}", len(data))


def _descriptor(media_type: str, blob: Blob, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    d: dict[str, Any] = {"mediaType": media_type, "digest": blob.digest, "size": blob.size}
    if annotations:
        d["annotations"] = annotations
    return d


def _platform(architecture: str) -> dict[str, str]:
    """The OCI platform of a Linux image of `architecture` (arm64 images are ARMv8)."""
    return {
        "architecture": architecture,
        "os": "linux",
        **({"variant": "v8"} if architecture == "arm64" else {}),
    }


def native() -> str:
    """This machine's architecture as OCI names it."""
    machine = os.uname().machine
    return {"x86_64": "amd64", "aarch64": "arm64"}.get(machine, machine)


def _pick(read: Any, index: dict[str, Any], architecture: str) -> dict[str, Any]:
    """The manifest of `architecture` under `index` (an index.json or an image index), following one
    nested index; `read(digest)` gives a blob's bytes. An image with no platform in its descriptor (one
    image alone) is taken as it is."""
    descriptors = index["manifests"]
    if len(descriptors) == 1 and descriptors[0]["mediaType"] == INDEX_TYPE:
        return _pick(read, json.loads(read(descriptors[0]["digest"])), architecture)
    for d in descriptors:
        if (
            d["mediaType"] == MANIFEST_TYPE
            and d.get("platform", {}).get("architecture", architecture) == architecture
        ):
            found: dict[str, Any] = json.loads(read(d["digest"]))
            return found
    have = sorted(d.get("platform", {}).get("architecture", "?") for d in descriptors)
    raise LookupError(f"no {architecture} image in the index (it has: {', '.join(have)})")


def _read_base(base: Path, architecture: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The image of `architecture` in the layout `base`: its manifest and its config."""
    blobs = base / "blobs" / "sha256"

    def read(digest: str) -> bytes:
        return (blobs / digest.removeprefix("sha256:")).read_bytes()

    manifest = _pick(read, json.loads((base / "index.json").read_text()), architecture)
    config = json.loads(read(manifest["config"]["digest"]))
    return manifest, config


def _base_layers(base: Path, manifest: dict[str, Any], config: dict[str, Any], blobs: Path) -> list[Blob]:
    """The base image's layers, copied into `blobs`, with their sizes unpacked (read through once)."""
    written = []
    for layer, diff_id in zip(manifest["layers"], config["rootfs"]["diff_ids"], strict=True):
        name = layer["digest"].removeprefix("sha256:")
        shutil.copyfile(base / "blobs" / "sha256" / name, blobs / name)
        unpacked = 0
        with gzip.open(blobs / name, "rb") as f:
            while chunk := f.read(CHUNK):
                unpacked += len(chunk)
        written.append(Blob(layer["digest"], layer["size"], diff_id, unpacked))
    return written


def build(
    root: Path,
    layout: Path,
    *,
    layers: Sequence[Layer],
    epoch: int,
    config: dict[str, Any],
    annotations: dict[str, str],
    ref_name: str,
    base: Path | None = None,
    architecture: str = "amd64",
) -> Image:
    """Write the OCI image layout of `root` into `layout` (emptied first) and return what it holds.

    `config` is the image's runtime configuration (User, Entrypoint, Env, WorkingDir, Labels);
    `annotations` go on the manifest; `ref_name` names the manifest in index.json; `architecture` is the
    image's (Debian's and OCI's name: amd64, arm64). With `base` (an OCI layout of one image, or of an
    index: its image of `architecture`), the layers of `root` are added on top of its layers, and
    `config` and `annotations` are merged over its own."""
    if layout.exists():
        shutil.rmtree(layout)
    blobs = layout / "blobs" / "sha256"
    blobs.mkdir(parents=True)
    below: list[Blob] = []
    history: list[dict[str, str]] = []
    if base is not None:
        base_manifest, base_config = _read_base(base, architecture)
        below = _base_layers(base, base_manifest, base_config, blobs)
        history = base_config.get("history", [])
        labels = {**base_config["config"].get("Labels", {}), **config.get("Labels", {})}
        config = {**base_config["config"], **config, "Labels": labels}
        annotations = {**base_manifest.get("annotations", {}), **annotations}
    groups: list[list[tuple[str, os.stat_result]]] = [[] for _ in layers]
    for rel, st in _walk(root):
        i = _owner(rel, layers)
        if i >= 0:
            groups[i].append((rel, st))
    written = []
    for i, rels in enumerate(groups):
        tmp = blobs / f".layer-{i}"
        own = layers[i].epoch
        blob = _write_layer(root, rels, epoch if own is None else own, tmp)
        tmp.rename(blobs / blob.digest.removeprefix("sha256:"))
        written.append(blob)
    created = dt.datetime.fromtimestamp(epoch, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    history = [*history, *({"created": created, "created_by": f"devtools.oci: {x.name}"} for x in layers)]
    written = below + written
    image_config = {
        **_platform(architecture),
        "created": created,
        "config": config,
        "rootfs": {"type": "layers", "diff_ids": [b.diff_id for b in written]},
        "history": history,
    }
    config_blob = _put(blobs, _json(image_config))
    manifest = {
        "schemaVersion": 2,
        "mediaType": MANIFEST_TYPE,
        "config": _descriptor(CONFIG_TYPE, config_blob),
        "layers": [_descriptor(LAYER_TYPE, b) for b in written],
        "annotations": annotations,
    }
    manifest_blob = _put(blobs, _json(manifest))
    index = {
        "schemaVersion": 2,
        "mediaType": INDEX_TYPE,
        "manifests": [
            _descriptor(MANIFEST_TYPE, manifest_blob, {"org.opencontainers.image.ref.name": ref_name})
        ],
    }
    (layout / "index.json").write_bytes(_json(index))
    (layout / "oci-layout").write_bytes(_json({"imageLayoutVersion": "1.0.0"}))
    names = [h["created_by"].removeprefix("devtools.oci: ") for h in history[: len(below)]]
    return Image(manifest_blob, config_blob, tuple(written), (*names, *(layer.name for layer in layers)))


def index(images: Sequence[Path], layout: Path, *, ref_name: str, annotations: dict[str, str]) -> Blob:
    """Write one OCI layout into `layout` (emptied first) holding the images of the one-image layouts
    `images`, one per architecture, under one image index (`annotations` on it); index.json names the
    index `ref_name`. Returns the index's blob: its digest is what a node pulls, the runtime then picks
    its own architecture's image."""
    if layout.exists():
        shutil.rmtree(layout)
    blobs = layout / "blobs" / "sha256"
    blobs.mkdir(parents=True)
    descriptors: list[dict[str, Any]] = []
    for image in images:
        (descriptor,) = json.loads((image / "index.json").read_text())["manifests"]
        manifest = json.loads(
            (image / "blobs" / "sha256" / descriptor["digest"].removeprefix("sha256:")).read_text()
        )
        config = json.loads(
            (image / "blobs" / "sha256" / manifest["config"]["digest"].removeprefix("sha256:")).read_text()
        )
        platform = {k: config[k] for k in ("architecture", "os", "variant") if k in config}
        if any(d["platform"] == platform for d in descriptors):
            raise ValueError(f"two images for {platform} in one index ({image})")
        for blob in (descriptor, manifest["config"], *manifest["layers"]):
            name = blob["digest"].removeprefix("sha256:")
            if not (blobs / name).exists():
                shutil.copyfile(image / "blobs" / "sha256" / name, blobs / name)
        descriptors.append({"mediaType": MANIFEST_TYPE, "digest": descriptor["digest"],
                            "size": descriptor["size"], "platform": platform})  # fmt: skip
    index_blob = _put(blobs, _json({"schemaVersion": 2, "mediaType": INDEX_TYPE, "manifests": descriptors,
                                    "annotations": annotations}))  # fmt: skip
    top = {
        "schemaVersion": 2,
        "mediaType": INDEX_TYPE,
        "manifests": [_descriptor(INDEX_TYPE, index_blob, {"org.opencontainers.image.ref.name": ref_name})],
    }
    (layout / "index.json").write_bytes(_json(top))
    (layout / "oci-layout").write_bytes(_json({"imageLayoutVersion": "1.0.0"}))
    return index_blob


def archive(layout: Path, out: Path, epoch: int) -> str:
    """Write the layout directory as one tar (an OCI archive), deterministically; return its sha256."""
    tmp = out.with_name(out.name + ".tmp")
    with tmp.open("wb") as raw:
        hashed = _Hashing(raw)
        with tarfile.open(fileobj=hashed, mode="w|", format=tarfile.PAX_FORMAT) as tar:  # type: ignore[call-overload]
            for rel, st in _walk(layout):
                info = _tarinfo(layout, rel, st, epoch)
                if info is None:
                    continue
                info.uid = info.gid = 0
                info.mtime = epoch
                info.mode = 0o755 if info.isdir() else 0o644
                if info.isreg():
                    with (layout / rel).open("rb") as f:
                        tar.addfile(info, f)
                else:
                    tar.addfile(info)
    tmp.rename(out)
    return hashed.sha.hexdigest()


def unpack(archive_path: Path, dest: Path, architecture: str | None = None) -> dict[str, Any]:
    """Extract an OCI archive's image of `architecture` (default: this machine's) into `dest`, layers in
    order; return its runtime config.

    For images this module wrote (no whiteouts, trusted content): run it as root to keep owners."""
    with tarfile.open(archive_path) as outer:

        def read(name: str) -> bytes:
            f = outer.extractfile(name)
            assert f is not None, name
            return f.read()

        def blob(digest: str) -> str:
            return "blobs/sha256/" + digest.removeprefix("sha256:")

        manifest = _pick(lambda d: read(blob(d)), json.loads(read("index.json")), architecture or native())
        config: dict[str, Any] = json.loads(read(blob(manifest["config"]["digest"])))["config"]
        dest.mkdir(parents=True, exist_ok=True)
        for layer in manifest["layers"]:
            f = outer.extractfile(blob(layer["digest"]))
            assert f is not None
            with tarfile.open(fileobj=f, mode="r|gz") as tar:
                tar.extractall(dest, filter="fully_trusted")  # noqa: S202 (our own layers, as root)
    return config


def chroot_argv(root: Path, config: dict[str, Any], args: Sequence[str]) -> list[str]:
    """A command line that runs the unpacked image at `root` as its config says (user, environment,
    working directory, entrypoint) without a container runtime: chroot in a new mount and PID namespace
    with the host's /dev and a fresh /proc, which disappear with the namespace. Needs root."""
    user = config.get("User", "0:0")
    if ":" not in user:
        user = f"{user}:{user}"
    env = list(config.get("Env", []))
    inner = f'mount --rbind /dev "{root}/dev" && exec chroot --userspec={user} "{root}" "$@"'
    workdir = config.get("WorkingDir") or "/"
    return [
        "unshare", "--mount", "--pid", "--fork", f"--mount-proc={root}/proc", "--",
        "sh", "-c", inner, "sh",
        "/usr/bin/env", "-i", *env, "/bin/sh", "-c", 'cd "$0" && exec "$@"', workdir,
        *config.get("Entrypoint", []), *args,
    ]  # fmt: skip


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


def main_index(argv: Sequence[str]) -> int:
    """`python -m devtools.oci index`: the one-image layouts of each architecture under one index."""
    parser = argparse.ArgumentParser(prog="python -m devtools.oci index", description=index.__doc__)
    parser.add_argument("images", type=Path, nargs="+", help="one-image OCI layouts, one per architecture")
    parser.add_argument("--layout", type=Path, required=True, help="the OCI layout directory to write")
    parser.add_argument("--archive", type=Path, required=True, help="the OCI archive (tar) to write")
    parser.add_argument("--epoch", type=int, required=True, help="SOURCE_DATE_EPOCH: the archive's mtimes")
    parser.add_argument("--config", type=Path, required=True, help="JSON: ref_name and annotations")
    args = parser.parse_args(argv)
    spec = json.loads(args.config.read_text())
    blob = index(args.images, args.layout, ref_name=spec["ref_name"], annotations=spec["annotations"])
    sha = archive(args.layout, args.archive, args.epoch)
    sys.stdout.write(f"index: {blob.digest}\narchive: {args.archive} sha256:{sha}\n")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["index"]:
        return main_index(argv[1:])
    parser = argparse.ArgumentParser(prog="python -m devtools.oci", description=__doc__.split("\n")[0])
    parser.add_argument("root", type=Path, help="the root filesystem directory")
    parser.add_argument("--layout", type=Path, required=True, help="the OCI layout directory to write")
    parser.add_argument("--archive", type=Path, required=True, help="the OCI archive (tar) to write")
    parser.add_argument("--epoch", type=int, required=True, help="SOURCE_DATE_EPOCH: the newest mtime")
    parser.add_argument("--config", type=Path, required=True, help="JSON: runtime config and annotations")
    parser.add_argument("--base", type=Path, help="an OCI layout whose image the layers go on top of")
    parser.add_argument("--architecture", default="amd64", help="the image's architecture (amd64, arm64)")
    parser.add_argument(
        "--layer",
        action="append",
        default=[],
        metavar="NAME[@EPOCH]=PREFIX[,PREFIX...]",
        help="in order; EPOCH: the layer's own newest mtime",
    )
    args = parser.parse_args(argv)
    spec = json.loads(args.config.read_text())
    layers = []
    for spec_ in args.layer:
        name, prefixes = spec_.split("=", 1)
        name, _, layer_epoch = name.partition("@")
        layers.append(Layer(name, tuple(prefixes.split(",")), int(layer_epoch) if layer_epoch else None))
    image = build(
        args.root,
        args.layout,
        layers=layers or [Layer("rootfs", ("",))],
        epoch=args.epoch,
        config=spec["config"],
        annotations=spec["annotations"],
        ref_name=spec["ref_name"],
        base=args.base,
        architecture=args.architecture,
    )
    sha = archive(args.layout, args.archive, args.epoch)
    out = sys.stdout
    for name, blob in zip(image.names, image.layers, strict=True):
        out.write(f"layer {name}: {_mb(blob.unpacked)} unpacked, {_mb(blob.size)} compressed\n")
    out.write(f"image: {_mb(image.unpacked)} unpacked, {_mb(image.compressed)} compressed\n")
    out.write(f"digest: {image.manifest.digest}\narchive: {args.archive} sha256:{sha}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
