"""The replicated state machine: events, the LMDB layout, apply, the store (no sockets, no ZooKeeper)."""
