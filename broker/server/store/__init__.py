"""A broker's state store in its process: opened checked (keeper, guard), tailed from the log
(follower), checkpointed, joined from a snapshot, locked to one process, and started without a log."""
