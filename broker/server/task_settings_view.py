"""A broker's options with the cluster-wide task settings in place of its own.

The parts that decide how tasks behave (the leader's lease defaults, retry backoff,
housekeeping, the in-sync tracker, the standing rules) are given an :class:`EffectiveConfig`
instead of the broker's :class:`~broker.server.config.BrokerConfig`: each task setting
(election/task_settings.py) is then the value the broker's log recorded, else the ``config``
node's, else the broker's own option, looked up at each use; every other option is the
broker's. So a failover changes none of them, and a logged change applies from the entry that
carries it.

Example::

    config = EffectiveConfig(cfg, store=lambda: server.store, configured=watch.settings)
    config.retry_backoff_ms   # the cluster's
    config.max_batch_events   # this broker's own option
    config.unrecorded()       # [(name, value)] the config node holds and the log does not (yet)
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

from election.task_settings import SETTINGS, effective, unrecorded


class EffectiveConfig:
    """See the module docstring; reading a task setting costs one read of the store's meta record."""

    def __init__(
        self,
        own: Any,
        store: Callable[[], Any],
        configured: Callable[[], Mapping[str, Any]],
    ) -> None:
        self._own = own
        self._store = store
        self._configured = configured

    def _recorded(self) -> Mapping[str, Any]:
        store = self._store()
        return {} if store is None else store.task_settings()

    def __getattr__(self, name: str) -> Any:
        # Called only for names this object lacks: the task settings, then the broker's options.
        if name.startswith("_"):
            raise AttributeError(name)
        if name in SETTINGS:
            return effective(name, self._recorded(), self._configured(), self._own)
        return getattr(self._own, name)

    def task_settings(self) -> dict[str, Any]:
        """Every task setting as this broker acts on it now."""
        recorded, configured = self._recorded(), self._configured()
        return {name: effective(name, recorded, configured, self._own) for name in SETTINGS}

    def unrecorded(self) -> list[tuple[str, Any]]:
        """The ``config`` node's settings whose value the log has not recorded, in name order."""
        return unrecorded(self._configured(), self._recorded())
