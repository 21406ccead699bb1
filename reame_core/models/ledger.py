"""What Reame remembers about the model files it used: when, and which were verified.

One small JSON file in Reame's cache directory, keyed by the file's real path (the blob a
cache symlink points to). "Verified" records the size and mtime at which the bytes matched
the hub's checksum, so a multi-gigabyte file is hashed once, not on every start, and any
later change to it is noticed. The ledger is a convenience: if it cannot be read or written
Reame carries on (and verifies again next time).
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import structlog

log = structlog.get_logger(__name__)


class ModelLedger:
    def __init__(self, path: Path) -> None:
        self.path = path

    def last_used(self, file: Path) -> float | None:
        entry = self._load().get(_key(file), {})
        value = entry.get("last_used")
        return float(value) if isinstance(value, (int, float)) else None

    def is_verified(self, file: Path) -> bool:
        entry = self._load().get(_key(file), {})
        return entry.get("verified") == _stamp(file)

    def mark_used(self, file: Path) -> None:
        self._update(file, last_used=time.time())

    def mark_verified(self, file: Path) -> None:
        self._update(file, verified=_stamp(file))

    def forget(self, file: Path) -> None:
        entries = self._load()
        if entries.pop(_key(file), None) is not None:
            self._save(entries)

    def _update(self, file: Path, **values: Any) -> None:
        entries = self._load()
        entries.setdefault(_key(file), {}).update(values)
        self._save(entries)

    def _load(self) -> dict[str, dict[str, Any]]:
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as error:
            log.warning(
                "model ledger unreadable, starting afresh", path=str(self.path), error=str(error)
            )
            return {}
        return data if isinstance(data, dict) else {}

    def _save(self, entries: dict[str, dict[str, Any]]) -> None:
        # Write a sibling and rename it over: a reader never sees half a file.
        temporary: str | None = None
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, temporary = tempfile.mkstemp(dir=self.path.parent, prefix=".models-")
            with os.fdopen(fd, "w") as handle:
                json.dump(entries, handle, indent=1, sort_keys=True)
            os.replace(temporary, self.path)
        except OSError as error:
            log.warning("model ledger not saved", path=str(self.path), error=str(error))
            if temporary is not None:
                Path(temporary).unlink(missing_ok=True)


def _key(file: Path) -> str:
    return str(file.resolve())


def _stamp(file: Path) -> list[int]:
    stat = file.resolve().stat()
    return [stat.st_size, stat.st_mtime_ns]
