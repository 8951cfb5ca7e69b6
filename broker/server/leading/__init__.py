"""A leader's duties for one epoch: the Leadership, group commit, parked leases, housekeeping, rolls,
reads from its store, the leader clock and its part in a cluster shutdown."""
