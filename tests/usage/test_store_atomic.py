"""A change is applied, journaled and acknowledged, or not applied at all — whatever fails.

Every kind of change the store makes (the table of ``test_journal``) is run with a failure
injected at each step of its commit: inside the ledger while the totals are half updated, in
the ledger just after the change was applied, while the watch events are built, in the
journal's encoder, and in the journal's transaction after its first statement was written.
Wherever the step is reached, the change must raise the injected exception (not one the store
knows by type), leave the store and the journal exactly as they were (the readable state, the
forgotten uids, the revision writes answer with), publish nothing to watchers, and go through,
durably, once the failure is gone.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from accounting.ledger import Ledger
from accounting.ledger.tombstones import Tombstones
from accounting.ledger.totals import UsageTotals
from services.usage import store as store_module
from services.usage.events import UsageEvent, WatchContent
from services.usage.journal import Journal
from services.usage.store import UsageStore
from services.usage.watch_hub import WatchHub
from tests.usage.test_journal import CHANGES, _store_with_state, recovered, snapshot


class InjectedFailure(Exception):
    """The failure a test injects (no type the store handles on purpose)."""


class RecordingHub(WatchHub):
    """A hub with a watcher that wants everything: every change builds its events, and what
    is published is kept."""

    def __init__(self) -> None:
        super().__init__()
        self.published: list[UsageEvent] = []

    @property
    def watching(self) -> bool:
        return True

    @property
    def wanted(self) -> WatchContent:
        return WatchContent.ALL

    def publish(self, events: Sequence[UsageEvent]) -> None:
        self.published.extend(events)


class FailOnce:
    """Replaces ``owner.name`` with a wrapper that raises ``InjectedFailure`` on call number
    ``after + 1`` (the calls before it go through) and behaves from then on."""

    def __init__(self, owner: Any, name: str, after: int = 0) -> None:
        self.owner, self.name, self.after = owner, name, after
        self.calls = 0

    @property
    def triggered(self) -> bool:
        return self.calls > self.after

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        original = getattr(self.owner, self.name)

        def failing(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            if self.calls == self.after + 1:
                raise InjectedFailure(f"{self.name} failed")
            return original(*args, **kwargs)

        monkeypatch.setattr(self.owner, self.name, failing)


INJECTIONS: dict[str, Callable[[], FailOnce]] = {
    # The node's totals are updated, the namespace's not yet: the ledger is half changed.
    "ledger totals half updated": lambda: FailOnce(UsageTotals, "add_to_namespace"),
    "ledger just after the change (its overcommit check)": lambda: FailOnce(
        Ledger, "_overcommitted"),
    "ledger just after the release (the tombstone)": lambda: FailOnce(Tombstones, "bury"),
    "building the watch events": lambda: FailOnce(store_module, "UsageEvent"),
    "the journal's encoder": lambda: FailOnce(Journal, "_apply"),
    "the journal's second statement": lambda: FailOnce(Journal, "_apply", after=1),
}


def _seeded(path: Path) -> UsageStore:
    _store_with_state(path)._journal.close()  # type: ignore[union-attr]  # it has one
    store = UsageStore(Ledger(max_tombstones=2), Journal(path), hub=RecordingHub())
    store.recover()
    return store


@pytest.mark.parametrize("make_injection", INJECTIONS.values(), ids=INJECTIONS.keys())
def test_a_failure_at_any_step_leaves_nothing_applied(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, make_injection: Callable[[], FailOnce]
) -> None:
    reached: list[str] = []
    for number, (name, change) in enumerate(CHANGES):
        path = tmp_path / f"change-{number}" / "usage.sqlite3"
        path.parent.mkdir()
        store = _seeded(path)
        hub = store.hub
        assert isinstance(hub, RecordingHub)
        before, visible = snapshot(store), store.visible_revision
        injection = make_injection()
        with monkeypatch.context() as patch:
            injection.install(patch)
            with contextlib.suppress(InjectedFailure):
                change(store)
            if not injection.triggered:
                continue  # this change never takes that step
        reached.append(name)
        assert snapshot(store) == before, f"{name}: the failed change stayed applied"
        assert store.visible_revision == visible, name
        assert not hub.published, f"{name}: watchers were told of a change that was undone"
        assert snapshot(recovered(path, max_tombstones=2)) == before, f"{name}: journaled"
        change(store)
        assert snapshot(store) != before, name
        assert hub.published or name.startswith("forget a pod never seen") or (
            "beyond the tombstone bound" in name), name
        assert snapshot(recovered(path, max_tombstones=2)) == snapshot(store), name
        store._journal.close()  # type: ignore[union-attr]
    assert reached, "no change took this step: the injection tests nothing"
