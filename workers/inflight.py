"""Caps on repairs in flight (pure): a storm, a bad rule or forged faults must not reboot or replace the
fleet at once, whatever the quarantine's breaker let through.

A repair is *in flight* from the moment the janitor starts its round (the round's `started_at`) until the
round has an outcome. Two caps, fleet-wide, over every janitor replica: `max_in_flight` rounds of any step,
and `max_replacements` REPLACE rounds (a cloud terminate/replace cannot be undone: lower still). A round
that would pass a cap does not start: it waits (given back, tried again later), it does not fail.

Replicas decide at once without a lock: each round is started first (written), then the others in flight
are counted, and it goes ahead only if fewer than the cap were *others* (`over`). Of rounds started at the
same moment, the last to count sees every earlier one, so no more than the cap go ahead; at worst all of
them back off and try again later.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

REPLACE = "REPLACE"


@dataclass(frozen=True)
class Caps:
    max_in_flight: int | None = 10  # repairs of any step; None: no cap
    max_replacements: int | None = 2  # cloud replacements; None: no cap


NO_CAPS = Caps(None, None)


def over(caps: Caps, step: str, others: Iterable[str]) -> str | None:
    """Why a round of `step` must wait, given the steps of the *other* rounds in flight; None: it may go."""
    others = list(others)
    if caps.max_in_flight is not None and len(others) >= caps.max_in_flight:
        return f"{len(others)} repairs in flight; cap {caps.max_in_flight}"
    replacing = sum(s == REPLACE for s in others)
    if step == REPLACE and caps.max_replacements is not None and replacing >= caps.max_replacements:
        return f"{replacing} replacements in flight; cap {caps.max_replacements}"
    return None
