"""An environment variable set for a while: for a library that reads it as it starts
something (pydantic-settings a config file's path, llama.cpp a switch of its build), so that
the process and what it starts later see the environment as the user set it."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def variable_set(name: str, value: str) -> Iterator[None]:
    """`name` set to `value` inside the block, then as it was (unset if it was)."""
    before = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if before is None:
            del os.environ[name]
        else:
            os.environ[name] = before
