"""The usage recorder's accounting policy as the admission and scheduler daemons hold it.

Layer: services (runtime). Every setting that changes an answer (each vendor's resource names,
defaults and memory factor; whether the GPU count is a quota dimension) is the recorder's
configuration (``accounting.policy``). The admission and scheduler daemons keep no policy of
their own: ``RecorderPolicy`` holds the one the recorder published last, from ``GetPolicy`` or
the first event of a WatchUsage stream (``send_policy``), and ``under_recorder_policy`` makes
every answer one computed under the policy of the recorder state it read:

* At start nothing is held; the first answer that needs a policy reads it (``GetPolicy``, with
  the usual deadline). While the recorder cannot be reached such an answer is UNAVAILABLE, like
  one whose usage cannot be read: never an answer under guessed rules. A pod that names no
  extended resource asks for no device under any policy, so it is answered without one, as it
  is answered without usage.
* A change of policy is a change of the recorder's configuration, made by restarting it. Every
  read of the recorder's state tells which policy it answers under (``GetNamespaceUsage``'s
  ``policy_id``; a watch stream starts with its policy): the reader hands that to ``observe``,
  which reads the new policy when it differs. An answer computed under a policy that is no
  longer the one held is computed again under the new one (``PolicyChangedError``). A
  reservation names the policy its grants were fitted under and the recorder refuses it under
  another one, so no placement is stored under other rules than the recorder's.
* While the recorder is unreachable the policy held is the last one it published. It decides
  nothing a read would not confirm: the first read after the recorder is back brings the
  policy it answers under.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Protocol, TypeVar

import grpc

from accounting.errors import InvalidInputError
from accounting.policy import AccountingPolicy
from hami.accounting.v1 import types_pb2, usage_pb2, usage_pb2_grpc
from services.common import convert, metrics
from services.common.errors import DependencyUnavailableError, recorder_unavailable

_LOG = logging.getLogger(__name__)

DEFAULT_POLICY_TIMEOUT_S = 2.0
"""Deadline of a GetPolicy call."""
MAX_POLICY_CHANGES = 3
"""How many policy changes one answer follows before it gives up (UNAVAILABLE): a recorder
restarting again and again under new policies while one answer is computed."""

T = TypeVar("T")


class PolicyChangedError(Exception):
    """The recorder answers under another accounting policy than the one an answer was being
    computed under: compute it again under the recorder's (``under_recorder_policy``)."""

    def __init__(self, policy_id: str) -> None:
        self.policy_id = policy_id
        """The recorder's policy id; "" when it did not say which (a refused reservation)."""
        super().__init__(f"the usage recorder answers under accounting policy {policy_id or '?'}")


class PolicySource(Protocol):
    """Where an answer takes its accounting policy from."""

    def known(self) -> AccountingPolicy | None:
        """The policy held now, or None when none was received yet."""
        ...

    def current(self) -> AccountingPolicy:
        """The policy held, read first when none is.

        Raises:
            DependencyUnavailableError: none is held and the recorder cannot be reached.
        """
        ...

    def try_current(self) -> AccountingPolicy | None:
        """``current``, or None when none is held and the recorder does not answer at once."""
        ...

    def confirm(self, policy_id: str) -> AccountingPolicy:
        """The policy with ``policy_id`` ("" for "another one"): the one held when it matches,
        else read anew.

        Raises:
            DependencyUnavailableError: the recorder cannot be reached.
        """
        ...

    def observe(self, policy_id: str) -> None:
        """A read of the recorder's state was answered under ``policy_id`` ("" when the answer
        does not say): hold that policy from now on.

        Raises:
            DependencyUnavailableError: it differs and the recorder cannot be reached.
        """
        ...


class FixedPolicy:
    """One policy that never changes: for the accounting embedded without a recorder (tests,
    offline tools). The daemons take theirs from the recorder (``RecorderPolicy``)."""

    def __init__(self, policy: AccountingPolicy) -> None:
        self._policy = policy

    def known(self) -> AccountingPolicy:
        return self._policy

    def current(self) -> AccountingPolicy:
        return self._policy

    def try_current(self) -> AccountingPolicy:
        return self._policy

    def confirm(self, policy_id: str) -> AccountingPolicy:
        return self._policy

    def observe(self, policy_id: str) -> None:
        pass


class RecorderPolicy:
    """The recorder's accounting policy, read when first needed and whenever it changed."""

    def __init__(
        self,
        channel: grpc.Channel,
        target: str,
        *,
        service: str,
        timeout_s: float = DEFAULT_POLICY_TIMEOUT_S,
    ) -> None:
        """Args: ``channel`` to the recorder at ``target`` (named in errors); ``service`` is
        the metrics label of this daemon (its policy gauges show the policy held)."""
        self._stub = usage_pb2_grpc.UsageRecorderStub(channel)
        self.target = target
        self._service = service
        self._timeout_s = timeout_s
        self._lock = threading.Lock()
        self._policy: AccountingPolicy | None = None

    def known(self) -> AccountingPolicy | None:
        with self._lock:
            return self._policy

    def current(self) -> AccountingPolicy:
        policy = self.known()
        return policy if policy is not None else self.refresh()

    def try_current(self) -> AccountingPolicy | None:
        policy = self.known()
        if policy is not None:
            return policy
        try:
            # Fail fast: an answer that needs no policy does not wait for a recorder that is
            # not there (connection refused), only for one that is slow.
            return self.refresh(wait_for_ready=False)
        except DependencyUnavailableError:
            return None

    def confirm(self, policy_id: str) -> AccountingPolicy:
        policy = self.known()
        if policy is not None and policy_id and policy.policy_id == policy_id:
            return policy
        return self.refresh()

    def observe(self, policy_id: str) -> None:
        policy = self.known()
        if policy_id and (policy is None or policy.policy_id != policy_id):
            self.refresh()

    def refresh(self, *, wait_for_ready: bool = True) -> AccountingPolicy:
        """Reads the policy from the recorder now and holds it; ``wait_for_ready`` waits out a
        reconnect within the deadline (the recorder starting after this daemon).

        Raises:
            DependencyUnavailableError: the recorder cannot be reached, or published a policy
                this daemon cannot read in full.
        """
        try:
            response = self._stub.GetPolicy(
                usage_pb2.GetPolicyRequest(),
                timeout=self._timeout_s,
                wait_for_ready=wait_for_ready,
            )
        except grpc.RpcError as error:
            raise recorder_unavailable(
                self.target, error, "the accounting policy is unknown"
            ) from None
        return self.accept(response.policy)

    def accept(self, pb: types_pb2.AccountingPolicy) -> AccountingPolicy:
        """Holds the policy the recorder published (GetPolicy, or a watch stream's first event).

        Raises:
            DependencyUnavailableError: a policy this daemon cannot run under, e.g. one with
                settings a newer recorder knows and this daemon does not: answering under part
                of the rules would answer differently from the recorder.
        """
        try:
            policy = convert.policy_from_pb(pb)
        except InvalidInputError as error:
            raise DependencyUnavailableError(
                f"usage recorder at {self.target} published an accounting policy this daemon "
                f"cannot run under ({error}); a recorder of a newer release with a newer setting "
                f"in use publishes such a policy: docs/upgrades.md says which releases run side "
                f"by side"
            ) from None
        with self._lock:
            previous, self._policy = self._policy, policy
        if previous != policy:
            metrics.publish_policy(self._service, policy)
            _LOG.info(
                "accounting policy %s from the usage recorder at %s: %s",
                policy.policy_id,
                self.target,
                policy.describe(),
                extra={
                    "policy_id": policy.policy_id,
                    "previous_policy_id": previous.policy_id if previous else None,
                },
            )
        return policy


def under_recorder_policy(
    source: PolicySource,
    asks_for_devices: Callable[[], bool],
    answer: Callable[[AccountingPolicy | None], T],
) -> T:
    """``answer`` computed under the policy the recorder answers under.

    ``answer(policy)`` reads the pod under ``policy`` (None: no policy is held, the recorder
    does not answer, and the pod names no extended resource, so it asks for no device under
    any) and raises
    ``PolicyChangedError`` when what it read was answered under another policy; it then runs
    again under that one.

    Raises:
        DependencyUnavailableError: the policy cannot be read, or kept changing.
    """
    policy = source.known()
    if policy is None:
        # A pod that asks for no device is answered without a policy when the recorder is
        # down, and under its policy (the same answer, with each vendor's zero request) else.
        policy = source.current() if asks_for_devices() else source.try_current()
    for _ in range(MAX_POLICY_CHANGES):
        try:
            return answer(policy)
        except PolicyChangedError as changed:
            policy = source.confirm(changed.policy_id)
    raise DependencyUnavailableError(
        f"the usage recorder's accounting policy changed {MAX_POLICY_CHANGES} times while one "
        "answer was computed; try again"
    )


def check_unchanged(source: PolicySource, policy: AccountingPolicy | None) -> None:
    """Raises ``PolicyChangedError`` when ``source`` holds another policy than ``policy`` (the
    one an answer was computed under), after a read told it the recorder's."""
    held = source.known()
    if policy is not None and held is not None and held.policy_id != policy.policy_id:
        raise PolicyChangedError(held.policy_id)
