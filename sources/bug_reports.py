"""The node agent's side of the repair Jobs' bug reports: the `nvidia-bug-report` outputs a repair Job's
first container leaves in the agent's state directory (`bug-reports/<request>.log.gz`, moved there whole),
uploaded to the store for the RMA bundles, then deleted from the node."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from faultline import store

log = logging.getLogger(__name__)
MAX_BYTES = 12 * 1024 * 1024  # of one report kept in the store (a document holds at most 16 MiB)
EVERY_S = 30.0  # between looks at the directory


def upload(st: store.Store, node: str, directory: Path) -> list[str]:
    """Upload every whole report in `directory` (not the dot-named ones still being written) and delete
    it; the names uploaded. A report over MAX_BYTES keeps its first MAX_BYTES (named `.truncated`)."""
    done: list[str] = []
    if not directory.is_dir():
        return done
    for path in sorted(directory.glob("*.log.gz")):
        if path.name.startswith(".") or not path.is_file():
            continue
        with path.open("rb") as f:
            data = f.read(MAX_BYTES + 1)
        name = path.name if len(data) <= MAX_BYTES else f"{path.name}.truncated"
        st.keep_bug_report(node, name, data[:MAX_BYTES], st.now())
        path.unlink()
        done.append(name)
        log.info(
            "bug report uploaded", extra={"node": node, "report": name, "bytes": min(len(data), MAX_BYTES)}
        )
    return done


class Uploader:
    """A thread that uploads the reports every EVERY_S seconds until `close`."""

    def __init__(self, st: store.Store, node: str, directory: Path, every: float = EVERY_S) -> None:
        self.st, self.node, self.directory, self.every = st, node, directory, every
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="bug-reports", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                upload(self.st, self.node, self.directory)
            except Exception as exc:  # noqa: BLE001 - the store away: the files wait for the next look
                log.warning("uploading bug reports failed: %s", exc, extra={"node": self.node})
            self.stop.wait(self.every)
