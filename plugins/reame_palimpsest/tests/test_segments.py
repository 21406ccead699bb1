"""The archive's directory shared by processes: appends, torn writes, damage, eviction."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np

from reame_palimpsest import record_format
from reame_palimpsest.segments import SegmentDirectory, purge, usage

FINGERPRINT = "0123456789abcdef"

# A writer process: appends `count` records tagged with its number, as a server would.
WRITER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    import numpy as np
    from reame_palimpsest import record_format
    from reame_palimpsest.segments import SegmentDirectory

    root, tag, count = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    directory = SegmentDirectory(root, sys.argv[4], segment_bytes=4096)
    for i in range(count):
        tokens = np.array([tag, i, *range(i, i + 40)], dtype=np.uint32)
        directory.append(record_format.encode(tokens, 2))
    directory.close()
    """
)

# A writer killed inside the write of its third record: the write is made in two halves
# with a pause between them, and the parent kills the process -9 in that pause.
TORN_WRITER = textwrap.dedent(
    """
    import os, sys, time
    from pathlib import Path
    import numpy as np
    from reame_palimpsest import record_format
    from reame_palimpsest.segments import SegmentDirectory

    root, flag = Path(sys.argv[1]), Path(sys.argv[2])
    directory = SegmentDirectory(root, sys.argv[3])
    real_write = os.write

    def halting_write(fd, data):
        half = real_write(fd, data[: len(data) // 2])
        flag.write_text(str(half))
        time.sleep(60)
        return half + real_write(fd, data[half:])

    rng = np.random.default_rng(0)
    for i in range(3):
        if i == 2:
            os.write = halting_write
        tokens = rng.integers(0, 50000, 500 + i).astype(np.uint32)
        directory.append(record_format.encode(tokens, 0))
    """
)


def child(script: str, *args: object) -> subprocess.Popen[bytes]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    return subprocess.Popen([sys.executable, "-c", script, *map(str, args)], env=env)


def test_two_processes_appending_at_once_lose_and_break_nothing(tmp_path: Path) -> None:
    writers = [child(WRITER, tmp_path, tag, 300, FINGERPRINT) for tag in (1, 2)]
    assert [w.wait(120) for w in writers] == [0, 0]

    reader = SegmentDirectory(tmp_path, FINGERPRINT)
    found, _ = reader.poll()

    by_writer: dict[int, list[int]] = {1: [], 2: []}
    for _, record in found:
        tag, i = int(record.tokens[0]), int(record.tokens[1])
        assert record.tokens[2:].tolist() == list(range(i, i + 40))
        by_writer[tag].append(i)
    assert by_writer == {1: list(range(300)), 2: list(range(300))}
    assert reader.counters.frames_damaged == 0
    # No two processes append to one file: every segment holds one writer's records.
    segments_of = {name: {int(r.tokens[0]) for n, r in found if n == name} for name, _ in found}
    assert all(len(tags) == 1 for tags in segments_of.values())


def test_a_writer_killed_during_an_append_leaves_every_earlier_record_readable(
    tmp_path: Path,
) -> None:
    flag = tmp_path / "half-written"
    writer = child(TORN_WRITER, tmp_path / "archive", flag, FINGERPRINT)
    deadline = time.monotonic() + 60
    while not flag.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert flag.exists(), "the writer never reached its third append"
    reader = SegmentDirectory(tmp_path / "archive", FINGERPRINT)
    live, _ = reader.poll()  # the writer lives: its half frame is an append in progress
    os.kill(writer.pid, signal.SIGKILL)
    assert writer.wait(30) == -signal.SIGKILL

    # The kill landed mid-write: the segment ends inside the third frame.
    (segment,) = (tmp_path / "archive" / "v1" / FINGERPRINT).glob("*.seg")
    data = segment.read_bytes()
    whole = record_format.scan(data)
    assert len(whole.records) == 2
    assert len(data) - whole.consumed == int(flag.read_text())
    assert len(live) == 2 and reader.counters.frames_damaged == 0

    after, _ = reader.poll()  # now the writer is gone: the torn frame is final damage
    assert after == []
    assert reader.counters.frames_damaged == 1
    fresh = SegmentDirectory(tmp_path / "archive", FINGERPRINT)
    records, _ = fresh.poll()
    assert [len(r.tokens) for _, r in records] == [500, 501]
    assert fresh.counters.frames_damaged == 1


def test_records_written_later_are_read_by_the_next_poll(tmp_path: Path) -> None:
    writer = SegmentDirectory(tmp_path, FINGERPRINT)
    reader = SegmentDirectory(tmp_path, FINGERPRINT)
    for i in range(3):
        writer.append(record_format.encode(np.arange(i, i + 10, dtype=np.uint32), 0))
        found, _ = reader.poll()
        assert [r.tokens[0] for _, r in found] == [i]
    assert reader.poll() == ([], set())


def test_a_writer_does_not_read_its_own_records_back(tmp_path: Path) -> None:
    directory = SegmentDirectory(tmp_path, FINGERPRINT)
    directory.append(record_format.encode(np.arange(10, dtype=np.uint32), 0))
    assert directory.poll() == ([], set())


def test_segments_are_sealed_at_their_size(tmp_path: Path) -> None:
    directory = SegmentDirectory(tmp_path, FINGERPRINT, segment_bytes=4096)
    rng = np.random.default_rng(1)
    for _ in range(40):
        directory.append(record_format.encode(rng.integers(0, 1 << 20, 300), 0))
    sizes = [p.stat().st_size for p in directory.path.glob("*.seg")]
    assert len(sizes) > 1
    assert all(size < 4096 + 1400 for size in sizes)


def test_eviction_deletes_the_oldest_segments_of_any_writer(tmp_path: Path) -> None:
    first = SegmentDirectory(tmp_path, FINGERPRINT, segment_bytes=4096)
    second = SegmentDirectory(tmp_path, "fedcba9876543210", segment_bytes=4096)
    rng = np.random.default_rng(2)
    for directory in (first, second):
        for _ in range(30):
            directory.append(record_format.encode(rng.integers(0, 1 << 20, 300), 0))
            time.sleep(0.002)  # distinct modification times
    oldest = min((tmp_path / "v1").glob("*/*.seg"), key=lambda p: p.stat().st_mtime)

    deleted, freed = second.evict(8192)

    held = sum(u.bytes for u in usage(tmp_path))
    assert deleted > 0 and freed > 0 and held <= 8192
    assert not oldest.exists()
    reader = SegmentDirectory(tmp_path, FINGERPRINT)
    reader.poll()  # what is left reads cleanly
    assert reader.counters.frames_damaged == 0


def test_a_vanished_segment_is_reported_and_its_writer_starts_another(tmp_path: Path) -> None:
    writer = SegmentDirectory(tmp_path, FINGERPRINT)
    reader = SegmentDirectory(tmp_path, FINGERPRINT)
    first = writer.append(record_format.encode(np.arange(10, dtype=np.uint32), 0))
    reader.poll()

    deleted, freed = purge(tmp_path)
    assert deleted == 1 and freed > 0
    second = writer.append(record_format.encode(np.arange(5, dtype=np.uint32), 0))

    found, vanished = reader.poll()
    assert vanished == {first}
    assert second != first and [len(r.tokens) for _, r in found] == [5]


def test_a_damaged_frame_is_skipped_and_the_next_one_read() -> None:
    frames = [record_format.encode(np.arange(i, i + 20, dtype=np.uint32), 3) for i in range(3)]
    for at in range(len(frames[1])):
        broken = bytearray(frames[1])
        broken[at] ^= 0x5A
        scan = record_format.scan(frames[0] + bytes(broken) + frames[2], final=True)
        assert [int(r.tokens[0]) for r in scan.records] == [0, 2], at
        assert scan.damaged == 1, at


def test_a_frame_cut_short_waits_for_the_rest_unless_final() -> None:
    frames = [record_format.encode(np.arange(i, i + 20, dtype=np.uint32), 0) for i in range(2)]
    for cut in range(1, len(frames[1])):
        data = frames[0] + frames[1][:cut]
        pending = record_format.scan(data)
        assert len(pending.records) == 1 and pending.damaged == 0, cut
        assert pending.consumed <= len(frames[0]) + max(0, cut - 3)
        rest = record_format.scan(data[pending.consumed :] + frames[1][cut:])
        assert len(rest.records) == 1 and rest.damaged == 0, cut
        final = record_format.scan(data, final=True)
        assert len(final.records) == 1 and final.damaged == 1 and final.consumed == len(data)


def test_a_first_poll_with_a_limit_reads_the_newest_segments_only(tmp_path: Path) -> None:
    writer = SegmentDirectory(tmp_path, FINGERPRINT, segment_bytes=4096)
    rng = np.random.default_rng(3)
    for i in range(60):
        tokens = np.array([i, *rng.integers(0, 1 << 20, 299)], dtype=np.uint32)
        writer.append(record_format.encode(tokens, 0))
    writer.close()

    reader = SegmentDirectory(tmp_path, FINGERPRINT)
    found, _ = reader.poll(limit_tokens=3000)

    firsts = [int(r.tokens[0]) for _, r in found]
    assert firsts == sorted(firsts) and firsts[-1] == 59  # the newest, oldest first
    assert 3000 <= 300 * len(firsts) < 3000 + 300 * 20
    assert reader.poll() == ([], set())  # the older ones are passed over for good
