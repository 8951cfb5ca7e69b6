"""What applications import: the Client, the Worker and the command handler of `worker run`."""
