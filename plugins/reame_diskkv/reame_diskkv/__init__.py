"""Persistent shared-prefix KV cache on disk, reused across prompts, restarts and processes.

A request's prompt prefix (a system prompt, a long document header) is snapshot after its
prefill and written to disk; a later request sharing that beginning — in this process, after
a restart, or in another process on the host — restores it instead of computing it.

    settings.py      the [plugins.diskkv] section and its host-derived defaults
    policy.py        which prefixes are worth a snapshot, which hits worth a read
    entry_format.py  the bytes of one entry: header, tokens, zstd payload, checksum
    index.py         the sqlite index: longest-prefix search over chained block hashes
    store.py         the directory: durable writes, checked reads, eviction, repair
    writer.py        the thread that compresses and writes, so the engine never waits
    plugin.py        the hook implementations
    cli.py           --kv-cache-dir, --kv-cache-budget, `reame cache stats|clear`
"""
