"""The bookie process: server, store, integrity checks, cookie, registration, long polls, config."""
