"""faultline's exception tree, by what the caller does next.

    FaultlineError
    ├── ConfigError          bad settings or flags: fix the configuration
    │   └── PackError        a pattern pack that cannot be loaded (file, pattern id, reason)
    ├── InputError           an input that cannot be read at all (missing file, not a log)
    ├── TransientError       retry after `delay` seconds
    ├── PermanentError       do not retry
    └── LeaseLostError       another worker owns the claim now: stop touching the document

Bad *lines* inside an input are not exceptions: parsers count them and report them as diagnostics.
"""

from __future__ import annotations


class FaultlineError(Exception):
    """Root of every error faultline raises on purpose."""


class ConfigError(FaultlineError):
    pass


class PackError(ConfigError):
    """A pattern pack failed to load; names the file, the pattern id (when known) and the reason."""

    def __init__(self, file: str, reason: str, pattern_id: str | None = None) -> None:
        self.file = file
        self.pattern_id = pattern_id
        self.reason = reason
        where = f"{file}: pattern {pattern_id!r}" if pattern_id else file
        super().__init__(f"{where}: {reason}")


class InputError(FaultlineError):
    pass


class TransientError(FaultlineError):
    def __init__(self, message: str, delay: float = 1.0) -> None:
        self.delay = delay
        super().__init__(message)


class PermanentError(FaultlineError):
    pass


class LeaseLostError(FaultlineError):
    pass
