"""The poll schedule: a jittered, growing, capped interval between queries of one task."""

from __future__ import annotations

import random

from .._config import PollPolicy

JITTER_LOW = 0.8  # each interval is scaled by a factor in [JITTER_LOW, 1.0]


def poll_interval(policy: PollPolicy, n: int, rng: random.Random) -> float:
    """The ``n``-th (0-based) sleep between queries; never more than ``max_interval``."""
    grown = policy.initial_interval * policy.multiplier ** min(n, 200)
    return min(policy.max_interval, grown) * rng.uniform(JITTER_LOW, 1.0)
