"""fencepost election: the coordination base every other package stands on.

The top level is coordination through ZooKeeper: paths, the election with epochs, persistent broker
ids, the in-sync set, live nodes, the cluster config and the join rules. Three subpackages hold the
rest of what every process shares: ``wire/`` (the envelope, error codes, the one-off exchange and the
serving kernel both servers use), ``secure/`` (CURVE keys, ZAP, roles) and ``local/`` (files written
whole, LMDB file checks, store status, settings, the metrics endpoint, the clock, human formats, the
dev cluster's record).
"""


class ElectionError(Exception):
    """Root of every error raised by the `election` package."""
