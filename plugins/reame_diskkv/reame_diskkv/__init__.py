"""Persistent shared-prefix KV cache on disk, reused across prompts, restarts and processes."""
