"""What serves inside one NPU process: the paged KV cache (more of serving to come, DESIGN section 12)."""
