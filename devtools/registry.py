"""The loopback registry real nodes pull from, and what is pushed to it, through the image tooling's own
entry points: `image/supply-chain.sh registry` serves it (crane), `image/supply-chain.sh push` pushes the
project's image by digest with its signature, SBOM attestation and the chart (what `make push` does).

The pause image (the pods' sandbox) is ours too: tools/pause (a static Go program) in an image FROM
scratch written by devtools.oci, pushed with crane.

    with LocalRegistry(workdir) as reg:
        ref = reg.push_project_image()        # 127.0.0.1:PORT/images/faultline@sha256:...
        analyzer = reg.push_analyzer_image()  # 127.0.0.1:PORT/images/faultline-analyzer@sha256:...
        pause = reg.push_pause_image()        # 127.0.0.1:PORT/faultline/pause:<version>
        store = reg.push_store_images()       # {"ferretdb": "127.0.0.1:PORT/images/ferretdb@sha256:...", ...}
"""

from __future__ import annotations

import shutil
import ssl
import subprocess
from pathlib import Path
from types import TracebackType

from devtools import oci, procs, tools
from devtools.netproxy import NetProxy
from faultline.errors import ConfigError

SUPPLY_CHAIN = tools.REPO / "image" / "supply-chain.sh"
IMAGE_DIR = tools.REPO / ".cache" / "image"
ANALYZER_DIR = IMAGE_DIR / "analyzer"  # make image-analyzer: the image and the anomaly extra
PAUSE_TAG = "faultline/pause:1"
STORE_IMAGES = ("ferretdb", "postgres")  # the chart's embedded store (image/store.sh)


class LocalRegistry:
    def __init__(self, workdir: Path) -> None:
        self.dir = workdir
        self.address = ""
        self.proc: procs.Proc | None = None

    def start(self) -> LocalRegistry:
        tools.ensure("crane")
        self.dir.mkdir(parents=True, exist_ok=True)
        self.address = f"127.0.0.1:{procs.free_port()}"
        self.proc = procs.Proc(
            "registry", ["bash", str(SUPPLY_CHAIN), "registry", self.address], self.dir / "registry.log"
        )
        procs.wait_for("the registry", self._answers, 30, proc=self.proc)
        return self

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()
            self.proc = None

    def __enter__(self) -> LocalRegistry:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def _answers(self) -> bool:
        return _crane("catalog", "--insecure", self.address, check=False).returncode == 0

    def push_project_image(self) -> str:
        """The project's image (`make image`; built here when missing) pushed by digest, signed, its SBOM
        attested and the chart pushed beside it: `image/supply-chain.sh push`. Returns the reference."""
        if not (IMAGE_DIR / "digest").is_file() or _built_from() != _head():
            # built from another commit: its chart and code are not the ones under test
            _script(["bash", str(tools.REPO / "image" / "build.sh")], "make image", timeout=1800)
        tools.ensure("crane", "cosign", "syft", "helm")
        _script(["bash", str(SUPPLY_CHAIN), "push", self.address], "image/supply-chain.sh push", timeout=900)
        return f"{self.address}/images/faultline@{(IMAGE_DIR / 'digest').read_text().strip()}"

    def push_analyzer_image(self) -> str:
        """The analyzer image (`make image-analyzer`: the project's image and the anomaly extra; built here
        when missing or not on the project's image of HEAD, which image/analyzer.sh builds first when it
        is not current) pushed by digest, signed and its SBOM attested: `image/supply-chain.sh
        push-analyzer`, unless `push` already did (it pushes a current one with the project's image).
        Returns the reference."""
        if not (ANALYZER_DIR / "digest").is_file() or _built_from(ANALYZER_DIR) != _head():
            _script(["bash", str(tools.REPO / "image" / "analyzer.sh")], "make image-analyzer", timeout=1800)
        ref = f"{self.address}/images/faultline-analyzer@{(ANALYZER_DIR / 'digest').read_text().strip()}"
        if _crane("manifest", "--insecure", ref, check=False).returncode != 0:
            tools.ensure("crane", "cosign", "syft")
            argv = ["bash", str(SUPPLY_CHAIN), "push-analyzer", self.address]
            _script(argv, "image/supply-chain.sh push-analyzer", timeout=900)
        return ref

    def push_store_images(self) -> dict[str, str]:
        """The embedded store's images (`make image-store`; built here when missing, which needs root and
        Debian's mirror) pushed by digest and signed: `image/supply-chain.sh push-store` (`push` does it
        too when they are built). Returns each one's reference by name."""
        if len(self.store_refs()) < len(STORE_IMAGES):
            _script(["bash", str(tools.REPO / "image" / "store.sh")], "make image-store", timeout=1800)
        tools.ensure("crane", "cosign")
        _script(["bash", str(SUPPLY_CHAIN), "push-store", self.address], "image/supply-chain.sh push-store",
                timeout=600)  # fmt: skip
        return self.store_refs()

    def store_refs(self) -> dict[str, str]:
        """The references here of the store images that are built (what `push` pushed with the project's
        image, or `push_store_images`)."""
        store = IMAGE_DIR / "store"
        return {
            name: f"{self.address}/images/{name}@{(store / f'{name}.digest').read_text().strip()}"
            for name in STORE_IMAGES
            if (store / f"{name}.digest").is_file()
        }

    def push_pause_image(self) -> str:
        """The sandbox image: the static pause program as /pause in an image of its own."""
        tools.ensure("pause")
        root = self.dir / "pause-root"
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)
        shutil.copy2(tools.binary("pause"), root / "pause")
        layout = self.dir / "pause-oci"
        oci.build(
            root, layout, layers=[oci.Layer("pause", ("",))], epoch=0,
            config={"Entrypoint": ["/pause"], "User": "65535:65535"},
            annotations={"org.opencontainers.image.title": "faultline-pause"}, ref_name="1",
        )  # fmt: skip
        ref = f"{self.address}/{PAUSE_TAG}"
        _crane("push", "--insecure", str(layout), ref)
        return ref


def _crane(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(  # noqa: S603 - our own binary
        [str(tools.binary("crane")), *args], capture_output=True, text=True, check=False, timeout=120
    )
    if check and done.returncode != 0:
        raise ConfigError(f"crane {' '.join(args)} failed: {done.stderr.strip()}")
    return done


def _script(argv: list[str], what: str, *, timeout: float) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=timeout)  # noqa: S603
    if done.returncode != 0:
        raise ConfigError(f"{what} failed ({done.returncode}):\n{done.stdout[-2000:]}{done.stderr[-2000:]}")


def _built_from(directory: Path = IMAGE_DIR) -> str:
    """The commit the image in `directory` was built from ("" when unknown)."""
    path = directory / "revision"
    return path.read_text().strip() if path.is_file() else ""


def _head() -> str:
    done = subprocess.run(  # noqa: S603 - our own arguments
        ["git", "-C", str(tools.REPO), "rev-parse", "HEAD"],  # noqa: S607 - git from PATH, as image/build.sh
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    return done.stdout.strip()


def tls_front(address: str, cert: Path, key: Path) -> NetProxy:
    """The registry at `address` behind HTTPS, as registries are outside a lab: a loopback proxy that
    terminates TLS with `cert` and passes the bytes on. Clients trust it through the CA that signed `cert`
    (for Go tools, SSL_CERT_FILE); containerd through `RealNodes.trust_registry`.

        front = tls_front(registry.address, pki.apiserver.cert, pki.apiserver.key)  # front.port; .stop()
    """
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    host, port = address.rsplit(":", 1)
    return NetProxy(int(port), target_host=host, tls=context).start()
