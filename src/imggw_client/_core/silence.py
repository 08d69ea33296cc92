"""How long the gateway has been asked and has answered nothing: what tells a gateway that is
down or hung from one that is merely slow to finish its tasks (a run's progress says it).

Pure: the driver tells each request sent and how it ended, with the time from its clock.
"""

from __future__ import annotations

__all__ = ["Silence", "answered"]


def answered(status: int | None) -> bool:
    """Whether a request's outcome is the gateway answering: any reply but a 5xx, which is
    the gateway (or a proxy in front of it) failing to. None is no reply at all.
    """
    return status is not None and status < 500


class Silence:
    """The gateway's silence, as one client's requests see it: counted from the first request
    sent since its last answer, or from its last answer while requests sent before it are
    still unanswered; 0 when it answered and nothing was asked since.
    """

    __slots__ = ("flying", "since")

    def __init__(self) -> None:
        self.flying = 0  # requests sent, not yet ended
        self.since: float | None = None  # when the silence began (None: none)

    def asked(self, now: float) -> None:
        """A request goes to the gateway."""
        self.flying += 1
        if self.since is None:
            self.since = now

    def heard(self, now: float, *, answer: bool) -> None:
        """A request ended: with an answer (see :func:`answered`), or with none."""
        self.flying = max(0, self.flying - 1)
        if answer:
            self.since = now if self.flying else None

    def silent_for(self, now: float) -> float:
        """Seconds the gateway has been asked and has answered nothing."""
        return 0.0 if self.since is None else max(0.0, now - self.since)
