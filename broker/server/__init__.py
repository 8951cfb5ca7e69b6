"""One broker process: ``node.py`` wires it; ``leading/`` holds a leader's duties, ``standing/`` the
candidacy and takeover, ``store/`` the store's keeping, follower tail, checkpoints and joining."""
