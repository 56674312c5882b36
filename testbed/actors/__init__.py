"""The cluster on Ray: the Ray session, the NPU and supernode actors, placement on Ray nodes, Ray's output."""
