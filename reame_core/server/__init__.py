"""The HTTP face of Reame (Litestar). HTTP handlers never touch the backend: they submit
requests to the engine and relay its events."""
