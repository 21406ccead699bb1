"""A fleet of Reame replicas on Ray Serve: one engine per replica, one OpenAI API in front,
a request router that keeps every replica's caches hot (`affinity`), and the shared disk
prefix cache and Palimpsest archive in one directory every replica reads and writes.

`affinity`, `forwarding` and the modules they use import without Ray (`pip install
'reame[ray]'` for the rest).
"""
