"""A secure cluster: CURVE key pairs and the keys file, the ZAP handler, roles, a process's keys."""
