"""One broker process: node lifecycle, takeover, request loop, group commit, follower tail,
checkpoints, joining, store keeping, configuration."""
