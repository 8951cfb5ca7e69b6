"""When a member without a broker id may apply for one while a cluster without a log starts (pure).

After ZooKeeper lost its data, ``brokers/next_id`` is 1 again while the kept stores'
brokers still own their ids in ``.broker.meta``. They register them again
(:func:`election.identity.ensure_broker_id`, moving ``next_id`` past each), but an
empty-disk broker started with them could read ``next_id`` first and take a kept
broker's id, which then refuses to start ("belongs to another broker").

So, while the cluster has no log and its members gather (``init/members``), a member
with no id reports itself without one (``init/members/new-<token>``) and applies only
once every member it waits for is present: each kept member registers its id before it
reports, so by then every kept id is in ``brokers/ids``. It then takes an id above every
id reported, registered, or named by the start's decision (:attr:`IdGate.floor`).
A member that arrives after the decision applies at once, above the decided members.

Example::

    gate = new_id_gate(reported_ids=[1, 2], newcomers=1, wait_for=3, registered_ids=[1, 2])
    gate.may_apply, gate.floor       # (True, 3)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable


@dataclass(frozen=True)
class IdGate:
    """Whether a member may apply for a new broker id now, the lowest id it may take, and why it waits."""

    may_apply: bool
    floor: int
    reason: str = ""


def new_id_gate(
    reported_ids: Iterable[int],
    newcomers: int,
    wait_for: int,
    registered_ids: Iterable[int],
    decided_members: Iterable[int] | None = None,
) -> IdGate:
    """The gate of one member without an id.

    ``reported_ids``: the ids of the members present in ``init/members``; ``newcomers``: the
    members present without an id, this one included; ``registered_ids``: the children of
    ``brokers/ids``; ``decided_members``: the members of ``init/decision`` once it exists.
    """
    known = set(reported_ids) | set(registered_ids) | set(decided_members or ())
    floor = max(known, default=0) + 1
    if decided_members is not None:
        return IdGate(True, floor)
    present = len(set(reported_ids)) + newcomers
    if present >= wait_for:
        return IdGate(True, floor)
    return IdGate(
        False,
        floor,
        f"the cluster has no log: waiting for {wait_for} members ({present} present) before taking "
        f"a new broker id, so that no kept store's id is taken",
    )
