"""Standing for election and taking over: candidacy, the waits that hold it back (members, bookies),
the in-sync tracker, and the takeover with its pure fencing steps."""
