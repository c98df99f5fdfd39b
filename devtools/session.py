"""`faultline dev cluster up|down`: a local cluster and FerretDB in the foreground, and a way to stop one
left running in the background (by the state file `up` writes). With real nodes, `down` also undoes what
they changed on the machine when `up` could not (it was killed), as the next `up` would."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from devtools import procs, realnode_host, volumes
from devtools.cluster import LocalCluster
from devtools.mongo import LocalMongo

STATE = Path(tempfile.gettempdir()) / f"faultline-dev-cluster-{os.getuid()}.json"


def up(
    nodes: int,
    emit: Callable[[str], None],
    *,
    state: Path = STATE,
    real_nodes: int = 0,
    project_image: bool = True,
) -> None:
    """Run until SIGINT/SIGTERM; emit `KUBECONFIG=...` and `MONGODB_URI=...` once everything is ready.
    With `real_nodes` (root only): also `REGISTRY=...`, `IMAGE=...` (the project's image there, unless not
    `project_image`), `FERRETDB_IMAGE=...` and `POSTGRES_IMAGE=...` (the chart's embedded store, when
    `make image-store` built them), `STORAGE_CLASS=...` (a PersistentVolume of it waits for the embedded
    store's claim) and `MONGODB_URI_PODS=...` (the store as pods on real nodes reach it)."""
    if state.exists() and procs.alive(json.loads(state.read_text()).get("pid", 0)):
        raise SystemExit(
            f"a dev cluster is already running (see {state}); stop it with `faultline dev cluster down`"
        )

    def on_term(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    if real_nodes:
        realnode_host.require_root()
    cluster = LocalCluster(nodes=nodes, real_nodes=real_nodes, project_image=project_image)
    mongo = LocalMongo()
    try:
        cluster.start()
        mongo.start()
        assert mongo.proc is not None
        real = cluster.real
        own = [*cluster.procs, *(real.procs if real else []), mongo.proc]
        if real is not None and real.registry.proc is not None:
            own.append(real.registry.proc)
        state.write_text(
            json.dumps(
                {
                    "pid": os.getpid(),
                    "children": [p.pid for p in own],
                    "kubeconfig": str(cluster.kubeconfig),
                    "mongodb_uri": mongo.uri,
                }
            )
        )
        emit(f"KUBECONFIG={cluster.kubeconfig}")
        emit(f"MONGODB_URI={mongo.uri}")
        if real is not None:
            emit(f"REGISTRY={real.registry.address}")
            if real.image:
                emit(f"IMAGE={real.image}")
            for name, ref in real.store_images.items():
                emit(f"{name.upper()}_IMAGE={ref}")
            volumes.add(cluster, "store-data", storage_class=volumes.LOCAL_CLASS, size="8Gi")
            emit(f"STORAGE_CLASS={volumes.LOCAL_CLASS}")
            emit(f"MONGODB_URI_PODS=mongodb://{cluster.expose(mongo.port)}/?directConnection=true")
            emit("# repair Jobs must never reboot this machine: set the chart's janitor.config.record_only")
        with_real = f" and {real_nodes} real nodes" if real_nodes else ""
        ready = f"{cluster.ready_seconds:.1f} s with {nodes} simulated GPU nodes{with_real}"
        emit(f"# ready in {ready}; Ctrl-C to stop")
        while True:
            time.sleep(1)
            dead = [p.name for p in own if not p.alive()]
            if dead:
                raise SystemExit(f"{', '.join(dead)} exited; stopping")
    except KeyboardInterrupt:
        pass
    finally:
        mongo.stop()
        cluster.stop()
        with contextlib.suppress(FileNotFoundError):
            state.unlink()


def down(*, state: Path = STATE, timeout: float = 30.0) -> str:
    """Stop the dev cluster recorded in `state`; return what was done."""
    if not state.exists():
        cleaned = realnode_host.cleanup_stale() if os.geteuid() == 0 else []
        return "no dev cluster is running" + (
            f"; undid the host changes of real nodes left by a crash ({len(cleaned)})" if cleaned else ""
        )
    info = json.loads(state.read_text())
    pid = int(info.get("pid", 0))
    if procs.alive(pid):
        os.kill(pid, signal.SIGTERM)
        procs.wait_for("the dev cluster to stop", lambda: not procs.alive(pid), timeout)
    leftovers = [c for c in info.get("children", []) if procs.alive(c)]
    for child in leftovers:  # `up` was killed hard: stop its process groups ourselves
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(child, signal.SIGKILL)
    cleaned = realnode_host.cleanup_stale() if os.geteuid() == 0 else []  # what its real nodes changed
    with contextlib.suppress(FileNotFoundError):
        state.unlink()
    return (
        f"stopped the dev cluster (pid {pid})"
        + (f" and {len(leftovers)} orphaned processes" if leftovers else "")
        + (f"; undid the host changes of its real nodes ({len(cleaned)})" if cleaned else "")
    )
