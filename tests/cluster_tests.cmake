# Tests that run real processes on 127.0.0.1, and the in-process cluster.
