"""A leader's duties for one epoch: the Leadership, its parked leases."""
