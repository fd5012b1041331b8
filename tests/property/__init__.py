"""Property tests for kvtrace: generated drain loops and KV senders, an executing oracle, and the
comparison of kvtrace's verdicts with the oracle's. See README.md in this folder."""
