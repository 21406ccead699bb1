"""The generation archive on a real file system that fails: full (a small tmpfs: appends
cut short by the kernel), failing read-only under the open segment (ext4 after a disk
error), read-only from the start, deleted while the server runs; writers killed -9 at
random moments of their appends; several processes appending and evicting under one
budget. Answers stay the model's own greedy tokens, every record read back is exactly one
that was written, and a fault is said once in the log and counted in the metrics."""

from __future__ import annotations

import random
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import structlog
from palimpsest_testing import ArchivedEngine, StartArchive, accepted

from reame_palimpsest.segments import SegmentDirectory

if TYPE_CHECKING:
    from conftest import SmallDisk

PROMPT = "Describe the lighthouse keeper's lantern for the harbour catalogue:"
FINGERPRINT = "0123456789abcdef"


def warnings_in(logs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [line for line in logs if line["log_level"] == "warning"]


def faults(running: ArchivedEngine) -> dict[str, int]:
    stats = running.archive.reame_collect_stats()
    assert stats is not None
    return dict(stats["disk_faults"]["palimpsest"])


def exact(running: ArchivedEngine, prompt: list[int]) -> int:
    """Generate greedily; the tokens must be the model's own. Returns accepted drafts."""
    finished = running.generate(prompt)
    assert running.tokens(finished) == running.reference(prompt)
    return accepted(finished)


def written_records(running: ArchivedEngine, prompts: list[list[int]]) -> set[tuple[int, ...]]:
    """What the archive holds for each prompt that was recorded: the prompt's tail, then
    the output."""
    keep = running.archive.settings.prompt_tokens
    return {tuple(p[-keep:] + running.reference(p)) for p in prompts}


def read_back(directory: Path) -> tuple[list[tuple[int, ...]], int]:
    """Every record another process reads from `directory`, and the frames it skipped."""
    reader = SegmentDirectory(directory, next((directory / "v1").iterdir()).name)
    found, _ = reader.poll()
    return [tuple(int(t) for t in r.tokens) for _, r in found], reader.counters.frames_damaged


# ------------------------------------------------------------------ a full disk


def test_a_full_disk_keeps_answers_exact_drafts_from_what_it_holds_and_says_so_once(
    start_archive: StartArchive,
    small_disk: Callable[..., SmallDisk],
) -> None:
    disk = small_disk(1 << 20)
    running = start_archive({"dir": str(disk.path / "archive")})
    before = [running.text(f"{PROMPT} item {i}") for i in range(3)]
    for prompt in before:
        exact(running, prompt)
    disk.fill()

    with structlog.testing.capture_logs() as logs:
        # Appends fill the segment's last page first: the kernel refuses the next one.
        after: list[list[int]] = []
        while not faults(running)["write_error"] and len(after) < 100:
            after.append(running.text(f"{PROMPT} other item {len(after)}"))
            exact(running, after[-1])
        for prompt in after[:3]:
            exact(running, prompt)
        assert exact(running, before[0]) > 0  # what is archived still drafts

    (warning,) = warnings_in(logs)
    assert "No space left" in warning["error"] or "short write" in warning["error"]
    assert faults(running)["write_error"] >= 1
    records, _ = read_back(disk.path / "archive")
    assert set(records) <= written_records(running, before + after)
    assert set(written_records(running, before)) <= set(records)


# ------------------------------------------------------------------ read-only


def test_a_disk_failing_read_only_while_serving_keeps_drafting_from_what_it_holds(
    start_archive: StartArchive, small_disk: Callable[..., SmallDisk]
) -> None:
    disk = small_disk(16 << 20, "ext4")
    running = start_archive({"dir": str(disk.path / "archive")})
    before = [running.text(f"{PROMPT} item {i}") for i in range(3)]
    for prompt in before:
        exact(running, prompt)
    disk.fail()  # read-only under the open segment

    with structlog.testing.capture_logs() as logs:
        for i in range(3):
            exact(running, running.text(f"{PROMPT} other item {i}"))
        assert exact(running, before[1]) > 0

    (warning,) = warnings_in(logs)
    assert "Read-only" in warning["error"]
    assert faults(running)["write_error"] >= 1
    records, damaged = read_back(disk.path / "archive")
    assert set(records) == written_records(running, before) and damaged == 0


def test_a_read_only_disk_at_start_serves_without_the_archive_and_counts_it(
    start_archive: StartArchive, small_disk: Callable[..., SmallDisk]
) -> None:
    disk = small_disk(1 << 20)
    disk.remount("ro")

    with structlog.testing.capture_logs() as logs:
        running = start_archive({"dir": str(disk.path / "archive")})
        prompt = running.text(PROMPT)
        for _ in range(2):
            exact(running, prompt)

    (warning,) = warnings_in(logs)
    assert "off" in warning["event"]
    assert faults(running)["directory_unusable"] == 1


# ------------------------------------------------------------------ deleted


def test_an_archive_deleted_while_serving_starts_again(
    start_archive: StartArchive, tmp_path: Path
) -> None:
    directory = tmp_path / "deleted"
    running = start_archive({"dir": str(directory)})
    gone = running.text(f"{PROMPT} item 0")
    exact(running, gone)
    shutil.rmtree(directory)

    kept = running.text(f"{PROMPT} item 1")
    exact(running, kept)
    exact(running, gone)  # answered as ever, whatever the archive lost

    restarted = start_archive({"dir": str(directory)})
    assert exact(restarted, kept) > 0  # recorded again, in the directory made anew
    records, damaged = read_back(directory)
    assert set(records) == written_records(running, [kept, gone]) and damaged == 0


# ------------------------------------------------------------------ processes

# Appends records that say what they hold (tag, number, then a run counting from the
# number), evicting to a budget after each, until killed or `count` are written.
APPENDER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    import numpy as np
    from reame_palimpsest import record_format
    from reame_palimpsest.segments import SegmentDirectory

    root, fingerprint = Path(sys.argv[1]), sys.argv[5]
    tag, count, budget = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    directory = SegmentDirectory(root, fingerprint, segment_bytes=4096)
    i = 0
    while i < count or count == 0:
        tokens = np.array([tag, i, *range(i, i + 200 + i % 50)], dtype=np.uint32)
        directory.append(record_format.encode(tokens, 2))
        if budget:
            directory.evict(budget)
        i += 1
    directory.close()
    """
)


def appender(root: Path, tag: int, count: int, budget: int = 0) -> subprocess.Popen[bytes]:
    args = [root, tag, count, budget, FINGERPRINT]
    return subprocess.Popen([sys.executable, "-c", APPENDER, *map(str, args)])


def assert_intact(records: list[tuple[int, ...]]) -> None:
    for tag, i, *run in records:
        assert run == list(range(i, i + 200 + i % 50)), f"record {tag}/{i} is not as written"


def test_appenders_killed_at_random_moments_leave_only_whole_records(tmp_path: Path) -> None:
    chance = random.Random(7)
    kills = 8
    for tag in range(kills):
        writer = appender(tmp_path, tag, 0)
        deadline = time.monotonic() + 60
        while not list(tmp_path.glob(f"v1/*/*_{writer.pid}_*")) and time.monotonic() < deadline:
            time.sleep(0.005)
        time.sleep(chance.uniform(0.0, 0.3))  # some appends in, then at any moment
        writer.send_signal(signal.SIGKILL)
        assert writer.wait(30) == -signal.SIGKILL

    records, damaged = read_back(tmp_path)

    assert_intact(records)
    assert {r[0] for r in records} == set(range(kills))  # every writer got records in
    for tag in range(kills):  # and each one's are every record it began, in order
        numbers = [r[1] for r in records if r[0] == tag]
        assert numbers == list(range(len(numbers)))
    assert damaged <= kills  # at most one torn frame per kill


def test_processes_appending_and_evicting_under_one_budget_keep_it(tmp_path: Path) -> None:
    budget = 48 << 10
    writers = [appender(tmp_path, tag, 150, budget) for tag in range(3)]
    reader = SegmentDirectory(tmp_path, FINGERPRINT)
    seen: list[tuple[int, ...]] = []
    while any(w.poll() is None for w in writers):
        found, _ = reader.poll()
        seen += [tuple(int(t) for t in r.tokens) for _, r in found]

    assert [w.returncode for w in writers] == [0, 0, 0]
    assert sum(p.stat().st_size for p in tmp_path.glob("v1/*/*.seg")) <= budget
    assert reader.counters.frames_damaged == 0
    assert_intact(seen)
    records, damaged = read_back(tmp_path)
    assert_intact(records)
    assert damaged == 0
    assert np.unique([r[:2] for r in records], axis=0).shape[0] == len(records)
