"""What serves inside one NPU process: the paged KV cache and the rest of a serving rank (docs/serving.md)."""
