"""What a process keeps on its own machine: files written whole, LMDB file checks, a store's status,
settings, the metrics endpoint, the clock and human-readable formats."""
