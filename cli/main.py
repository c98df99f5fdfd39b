"""The `faultline` entry point: `faultline replay ...` runs from `cli.replay_cmd` alone (no settings
models, no other command built: it starts in about half the time); everything else from `cli.app`."""

from __future__ import annotations

import gc
import os
import sys

from faultline.errors import FaultlineError


def main() -> None:
    # faultline uses no pydantic plugins: looking for them reads every installed package's entry points
    os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")
    if sys.argv[1:2] == ["replay"]:
        # No cyclic collection while the modules load (about 20 ms of a small replay's 0.3 s): the
        # command turns it on again once its packs are compiled, moving all that exists then out of its
        # scans (`gc.freeze`).
        gc.disable()
        from cli import replay_cmd  # noqa: PLC0415

        try:
            replay_cmd.standalone()()
        except FaultlineError as exc:
            replay_cmd.error(str(exc))
            sys.exit(2)
        return
    from cli import app  # noqa: PLC0415

    app.main()
