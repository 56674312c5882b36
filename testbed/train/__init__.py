"""What runs inside one NPU process: the rank's program, its device memory, checkpoint shards, in-
memory replicas.
"""
