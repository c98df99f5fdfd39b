"""The `faultline` entry point: `faultline replay ...` runs from `cli.replay_cmd` alone (no settings
models, no other command built: it starts in about half the time); `faultline agent ...` from `cli.agent`
(no CLI framework in the process that runs on every GPU node: see `cli.flags`); everything else, and the
help of every command, from `cli.app`."""

from __future__ import annotations

import gc
import os
import sys

from faultline.errors import FaultlineError

HELP_FLAGS = frozenset({"--help", "-h"})  # a command's help is printed by the full command line


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
    if sys.argv[1:2] == ["agent"] and not HELP_FLAGS & set(sys.argv[2:]):
        from cli import agent  # noqa: PLC0415

        try:
            agent.main(sys.argv[2:])
        except FaultlineError as exc:
            sys.stderr.write(f"error: {exc}\n")
            sys.exit(2)
        except KeyboardInterrupt:  # before the flow's own handler is in place: as the full command line says
            sys.stderr.write("Aborted!\n")
            sys.exit(1)
        return
    from cli import app  # noqa: PLC0415

    app.main()
