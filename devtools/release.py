"""A release's chart: the chart as committed, with its version and the images it installs by default set to
what `make release` pushed, so that `helm install faultline oci://REGISTRY/faultline --version X` needs no
other value.

Edits the copy of the chart that image/supply-chain.sh packages (never the checkout): Chart.yaml's
`version` and `appVersion`, and in values.yaml the repository and digest of the one image and of the
embedded store's two images. The edits are to the lines themselves, so the comments that document each
value stay; each line it looks for must be there exactly once, or it stops with the line it missed.

    python -m devtools.release CHART_DIR --version 1.2.0 --registry host:5000 \\
        --image sha256:... --ferretdb sha256:... --postgres sha256:...
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from pathlib import Path

DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
VERSION = re.compile(r"^\d+\.\d+\.\d+(-[0-9A-Za-z.-]+)?$")  # SemVer 2, as Helm requires


class ReleaseError(ValueError):
    """A value or a chart line that is not as the release needs it."""


def _replace_once(text: str, pattern: str, replacement: str, where: str) -> str:
    """`text` with the one match of `pattern` (multiline) replaced; an error naming `where` otherwise."""
    found = re.findall(pattern, text, flags=re.M)
    if len(found) != 1:
        raise ReleaseError(f"{where}: expected one line matching {pattern!r}, found {len(found)}")
    return re.sub(pattern, replacement, text, count=1, flags=re.M)


def _image_block(values: str, repository_line: str, registry: str, name: str, digest: str) -> str:
    """The image block whose `repository:` line is `repository_line`: repository in `registry`, digest set.
    The digest line is the first `digest: ""` after that repository line."""
    start = values.find(repository_line)
    if start < 0 or values.count(repository_line) != 1:
        raise ReleaseError(f"values.yaml: expected one line {repository_line.strip()!r}")
    head, block = values[:start], values[start:]
    indent = repository_line[: len(repository_line) - len(repository_line.lstrip())]
    block = f"{indent}repository: {registry}/images/{name}" + block[len(repository_line) :]
    match = re.search(rf'^{indent}digest: ""', block, flags=re.M)
    if match is None:
        raise ReleaseError(f'values.yaml: no digest: "" after {repository_line.strip()!r}')
    block = block[: match.start()] + f'{indent}digest: "{digest}"' + block[match.end() :]
    return head + block


def stamp(chart: Path, *, version: str, registry: str, digests: dict[str, str]) -> None:
    """Set the chart in `chart` to release `version` with its images from `registry` by the `digests` of
    `faultline`, `ferretdb` and `postgres` (image indexes)."""
    if not VERSION.match(version):
        raise ReleaseError(f"VERSION {version!r} is not a SemVer version (1.2.0, 1.2.0-rc.1): Helm needs one")
    if not registry or "/" in registry.split(":", 1)[0] or registry.endswith("/"):
        raise ReleaseError(f"REGISTRY {registry!r} is not host[:port][/path]")
    for name, digest in digests.items():
        if not DIGEST.match(digest):
            raise ReleaseError(f"the {name} digest {digest!r} is not sha256:<64 hex>: build it first")
    meta = chart / "Chart.yaml"
    text = meta.read_text()
    text = _replace_once(text, r"^version: .*$", f"version: {version}", str(meta.name))
    text = _replace_once(text, r"^appVersion: .*$", f'appVersion: "{version}"', str(meta.name))
    meta.write_text(text)
    path = chart / "values.yaml"
    values = path.read_text()
    blocks = {
        "faultline": "  repository: ghcr.io/faultline/faultline",
        "ferretdb": "        repository: ghcr.io/faultline/ferretdb",
        "postgres": "        repository: ghcr.io/faultline/postgres",
    }
    for name, line in blocks.items():
        values = _image_block(values, line, registry, name, digests[name])
    path.write_text(values)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devtools.release", description=__doc__.split("\n")[0])
    parser.add_argument("chart", type=Path, help="the chart directory to edit (a copy)")
    parser.add_argument("--version", required=True)
    parser.add_argument("--registry", required=True)
    for name in ("image", "ferretdb", "postgres"):
        parser.add_argument(
            f"--{name}", required=True, metavar="DIGEST", help=f"the {name} image index's digest"
        )
    args = parser.parse_args(argv)
    try:
        digests = {"faultline": args.image, "ferretdb": args.ferretdb, "postgres": args.postgres}
        stamp(args.chart, version=args.version, registry=args.registry, digests=digests)
    except (ReleaseError, OSError) as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
