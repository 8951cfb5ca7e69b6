"""Tools for local clusters, benchmarks, chaos runs and tests; nothing in the product imports it."""
