"""Test hosts: members in network namespaces (see testnet.py)."""
