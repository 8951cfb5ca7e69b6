"""The back-ends of the operator commands (status, admin, snapshot, store, bookie, cluster shutdown)
and the dashboard: what ``commands/`` calls, above ``broker/server`` and the client."""
