"""Token bytes in, safe text deltas out.

Text is released only when it is complete and final: bytes of a UTF-8 character split
across tokens wait for the rest (and are dropped if the sequence ends first), and text that
could be the start of a stop string waits until it is clear that it is not. A matched stop
string is cut, with everything after it.
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence


class TextStream:
    def __init__(self, stops: Sequence[str] = ()) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._stops = tuple(stops)
        self._held = ""
        self.text = ""
        self.stopped = False

    def push(self, data: bytes) -> str:
        """Add a token's bytes; return the text that is now safe to emit."""
        if self.stopped:
            return ""
        self._held += self._decoder.decode(data)
        return self._release()

    def finish(self) -> str:
        """The sequence ended: release whatever is held (no stop string can complete now).

        Bytes of a character the sequence did not finish (it hit max_tokens mid-character)
        are dropped rather than shown as U+FFFD.
        """
        if self.stopped:
            return ""
        self._decoder.reset()
        return self._release(final=True)

    def _release(self, final: bool = False) -> str:
        held = self._held
        keep = 0
        if self._stops:
            cut = min((i for stop in self._stops if (i := held.find(stop)) >= 0), default=-1)
            if cut >= 0:
                self.stopped = True
                held = held[:cut]
            elif not final:
                keep = _longest_stop_prefix_suffix(held, self._stops)
        delta = held[: len(held) - keep]
        self._held = held[len(held) - keep :] if keep else ""
        self.text += delta
        return delta


def _longest_stop_prefix_suffix(text: str, stops: Sequence[str]) -> int:
    """Length of the longest end of `text` that some stop string starts with."""
    best = 0
    for stop in stops:
        for length in range(min(len(stop) - 1, len(text)), best, -1):
            if text.endswith(stop[:length]):
                best = length
                break
    return best
