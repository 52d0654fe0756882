"""What one Filter knows of the pod's own stored reservation: ``ReservationAtStart``.

Layer: services/scheduler (adapter state). Every Reserve and release a Filter sends states the
reservation it replaces; this is where the Filter keeps what that is, and tells the pod's own
earlier reservation (a re-filter, to replace) from one a rival Filter stored meanwhile (to
leave standing).
"""

from __future__ import annotations

from collections.abc import Callable

from services.scheduler.convert import StoredReservation


class ReservationAtStart:
    """What the Filter knows of the pod's reservation, kept for the whole Filter (also when a
    change of policy computes the answer again): every Reserve and release it sends states
    it replaces exactly that.

    Two ways to know. Read directly (no cache): ``GetPodUsage``, beside the first snapshot.
    From the cache (the usual path): nothing is read; the Filter notes the cache's revision
    when it first read it (``saw``) and its Reserve states "nothing stored". If the recorder
    refuses that because the pod has a reservation, the refusal says which (its revision):
    one at or before that revision was in what the Filter read (the pod's own, from an
    earlier Filter: a re-filter), one after it was stored while this Filter ran (a rival's).
    """

    def __init__(self) -> None:
        self._wait: Callable[[], StoredReservation | None] | None = None
        self._known = False
        self._stored: StoredReservation | None = None
        self._seen: int | None = None

    def begin(self, start: Callable[[], Callable[[], StoredReservation | None]]) -> None:
        """Starts the direct read (``start`` returns the call that waits for it), once."""
        if not self._known and self._wait is None:
            self._wait = start()

    def saw(self, revision: int) -> None:
        """The Filter read the cache at ``revision`` (the first one counts)."""
        if self._seen is None:
            self._seen = revision

    def learn(self, stored: StoredReservation | None) -> None:
        """What is stored for the pod, read or told by the recorder."""
        if not self._known:
            self._stored, self._known, self._wait = stored, True, None

    def known(self) -> bool:
        """Whether the Filter knows what is stored (after the direct read is answered)."""
        if self._wait is not None:
            self.learn(self._wait())
        return self._known

    def stored(self) -> StoredReservation | None:
        """The pod's reservation as known, None when there is none or it is not known yet."""
        self.known()
        return self._stored

    def own(self, stored: StoredReservation) -> bool:
        """Whether ``stored`` was there when the Filter began (its own earlier reservation,
        to replace), rather than a rival's stored since (to leave standing)."""
        if self._seen is None:
            return True  # read directly before anything else
        return 0 < stored.revision <= self._seen

    def replaces(self) -> int:
        """What the Filter's Reserve states it replaces: the known reservation's revision, 0
        for none (also while not known: the optimistic path)."""
        stored = self.stored()
        return stored.revision if stored is not None and self.own(stored) else 0
