"""Recovery strategies: detection, restart, hot spare, in-memory replicas, retries, elastic shrink,
learned timeouts.
"""
