"""``--wait-for N``: a broker stands for election only once it has seen N brokers live.

Until then nobody can lead, so no broker serves clients: a cluster restarted one
member at a time does not elect the first broker that comes up (which may hold an
older state than one still starting). The count is the children of
``brokers/live`` (this broker included); once it reached N the condition holds
for the rest of the process, so a member lost later does not stop the cluster.

While waiting, the broker's live node carries ``"waiting_for": N, "present": M``
(``fencepost status`` shows "waiting for N members (M present)") and its
``not_leader`` replies name the wait.

Example::

    wait = MemberWait(zk, paths, wait_for=3, changed=live.mark_dirty)
    wait.hold()          # "waiting for 3 members (2 present)", or "" once 3 were seen
    wait.live_fields()   # {"waiting_for": 3, "present": 2} while waiting, else {}
"""

from __future__ import annotations

import logging
from typing import Callable

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from election.paths import ClusterPaths

log = logging.getLogger(__name__)


def wait_reason(wait_for: int, present: int) -> str:
    """How ``status``, the live node and the replies say it (pure)."""
    return f"waiting for {wait_for} members ({present} present)"


class MemberWait:
    """Whether this broker has seen ``wait_for`` live brokers yet (see the module docstring)."""

    def __init__(
        self, zk: KazooClient, paths: ClusterPaths, wait_for: int, changed: Callable[[], None] = lambda: None
    ) -> None:
        self.zk, self.paths, self.wait_for, self.changed = zk, paths, wait_for, changed
        self.present = 0
        self.met = wait_for <= 1

    def hold(self) -> str:
        """Why we may not stand yet ("" once the members were seen); reads ``brokers/live``."""
        if self.met:
            return ""
        try:
            present = len(self.zk.get_children(self.paths.live_brokers))
        except NoNodeError:
            present = 0
        if present != self.present:
            self.present = present
            self.changed()
        if present >= self.wait_for:
            self.met = True
            log.info(
                "%d members are present (waited for %d): standing for election from now on",
                present,
                self.wait_for,
            )
            self.changed()
            return ""
        return wait_reason(self.wait_for, present)

    def reason(self) -> str:
        """The last known reason to wait, without reading ZooKeeper (for the request loop)."""
        return "" if self.met else f"no broker serves yet: {wait_reason(self.wait_for, self.present)}"

    def live_fields(self) -> dict:
        return {} if self.met else {"waiting_for": self.wait_for, "present": self.present}
