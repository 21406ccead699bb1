"""CpuShare: how many threads decode, given what the neighbours take from the cores."""

from __future__ import annotations

from pathlib import Path

import pytest

from reame_core.backend.fake import FakeBackend
from reame_core.engine.cpu_share import CpuShare, CpuTimes, read_cpu_times
from reame_core.engine.engine import Engine
from reame_core.hookspecs import hookimpl
from reame_core.plugins import PluginHost
from reame_core.request import GenerationRequest, SamplingParams


class Host:
    """A host whose clock and CPU counters the test advances: each `run` lasts `seconds`,
    during which this process uses `own` cores and the neighbours `others`."""

    def __init__(self) -> None:
        self.wall = 0.0
        self.busy = 0.0
        self.own = 0.0

    def read(self) -> CpuTimes:
        return CpuTimes(self.wall, self.busy, self.own)

    def clock(self) -> float:
        return self.wall

    def run(self, seconds: float, *, own: float, others: float) -> None:
        self.wall += seconds
        self.own += own * seconds
        self.busy += (own + others) * seconds


def share_on(host: Host, threads: int = 2, cpus: int = 2) -> CpuShare:
    return CpuShare(threads, cpus, read=host.read, clock=host.clock)


def settle(share: CpuShare, host: Host, *, others: float, windows: int = 1) -> int:
    for _ in range(windows):
        host.run(0.5, own=share.threads, others=others)
        share.update()
    return share.threads


def test_a_quiet_host_keeps_every_thread() -> None:
    host = Host()
    share = share_on(host)
    assert settle(share, host, others=0.02, windows=5) == 2


def test_a_busy_neighbour_takes_a_thread_away_at_once() -> None:
    host = Host()
    share = share_on(host)
    assert settle(share, host, others=1.0) == 1
    assert share.others == pytest.approx(1.0)


def test_a_neighbour_busy_a_quarter_of_the_time_leaves_the_threads() -> None:
    host = Host()
    share = share_on(host)
    assert settle(share, host, others=0.25, windows=3) == 2


def test_a_neighbour_busy_half_the_time_takes_a_thread() -> None:
    host = Host()
    share = share_on(host)
    assert settle(share, host, others=0.5) == 1


def test_threads_come_back_after_the_neighbour_has_been_quiet_for_two_measurements() -> None:
    host = Host()
    share = share_on(host)
    settle(share, host, others=1.0)
    assert settle(share, host, others=0.0) == 1
    assert settle(share, host, others=0.0) == 2


def test_a_neighbour_between_the_thresholds_changes_nothing() -> None:
    host = Host()
    share = share_on(host)
    settle(share, host, others=1.0)
    assert settle(share, host, others=0.35, windows=4) == 1  # not quiet enough to add one
    host = Host()
    share = share_on(host)
    assert settle(share, host, others=0.35, windows=4) == 2  # not busy enough to take one


def test_threads_come_back_one_at_a_time() -> None:
    host = Host()
    share = share_on(host, threads=4, cpus=4)
    assert settle(share, host, others=3.0) == 1
    seen = [settle(share, host, others=0.0, windows=2) for _ in range(3)]
    assert seen == [2, 3, 4]


def test_only_cores_beyond_the_configured_threads_absorb_a_neighbour() -> None:
    host = Host()
    share = share_on(host, threads=2, cpus=4)
    assert settle(share, host, others=1.0) == 2
    assert settle(share, host, others=2.0) == 2
    assert settle(share, host, others=3.0) == 1


def test_nothing_is_measured_before_an_interval_has_passed() -> None:
    host = Host()
    share = share_on(host)
    host.run(0.1, own=2, others=1.0)
    assert share.update() is None
    assert share.threads == 2


def test_a_neighbour_busy_only_while_the_engine_idles_takes_no_thread() -> None:
    host = Host()
    share = share_on(host)
    for _ in range(6):  # requests of 0.3 s on a quiet host, a neighbour busy in between
        host.run(0.3, own=2, others=0.0)
        share.update()
        share.pause()
        host.run(1.0, own=0.0, others=2.0)
        share.resume()
    assert share.threads == 2
    assert share.others == pytest.approx(0.0)


def test_a_long_idle_time_is_not_taken_for_the_present() -> None:
    host = Host()
    share = share_on(host)
    share.pause()
    host.run(30.0, own=0.0, others=1.0)  # the engine slept while a neighbour ran
    share.resume()
    assert settle(share, host, others=0.0) == 2


def test_short_requests_add_up_to_a_measurement() -> None:
    host = Host()
    share = share_on(host)
    changes = []
    for _ in range(4):  # requests of 0.2 s beside a neighbour, each followed by a pause
        host.run(0.2, own=2, others=1.0)
        changes.append(share.update())
        share.pause()
        host.run(0.05, own=0, others=1.0)
        share.resume()
    assert changes == [None, None, 1, None]  # at 0.6 s of work, past the interval
    assert share.others == pytest.approx(1.0)


def test_one_long_collapsed_step_still_counts() -> None:
    host = Host()
    share = share_on(host)
    host.run(3.5, own=2, others=1.0)  # a single step that took seconds beside a neighbour
    assert share.update() == 1


def test_the_update_reports_a_change_once() -> None:
    host = Host()
    share = share_on(host)
    host.run(0.5, own=2, others=1.0)
    assert share.update() == 1
    host.run(0.5, own=1, others=1.0)
    assert share.update() is None
    assert share.changes == 1


def test_a_single_thread_is_never_adapted() -> None:
    host = Host()
    share = share_on(host, threads=1)
    assert not share.active
    host.run(0.5, own=1, others=1.0)
    assert share.update() is None


def test_without_cpu_counters_the_threads_stay_as_configured() -> None:
    share = CpuShare(2, 2, read=lambda: None)
    assert not share.active
    assert share.update() is None
    assert share.threads == 2


PROC_STAT = """\
cpu  900 0 300 5000 100 0 0 40 0 0
cpu0 400 0 100 2500 50 0 0 20 0 0
cpu1 500 0 200 2500 50 0 0 20 7 0
cpu2 999 0 999 0 0 0 0 999 0 0
intr 12345
"""


def test_cpu_times_count_this_process_s_cores_steal_included_idle_and_iowait_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stat = tmp_path / "stat"
    stat.write_text(PROC_STAT)
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setattr("os.sysconf", lambda name: 100)
    times = read_cpu_times(stat)
    assert times is not None
    # cpu0: 400 + 100 + 20 steal; cpu1: 500 + 200 + 20 steal (guest is inside user already)
    assert times.busy == pytest.approx((520 + 720) / 100)


def test_cpu_times_are_none_where_the_host_has_no_proc_stat(tmp_path: Path) -> None:
    assert read_cpu_times(tmp_path / "missing") is None


def test_the_engine_decodes_with_fewer_threads_while_a_neighbour_is_busy() -> None:
    host = Host()
    backend = FakeBackend(n_threads=2)
    share = share_on(host)
    engine = Engine(backend, cpu_share=share, speculate="off")
    request = GenerationRequest([1, 5, 6, 7], SamplingParams(max_tokens=6, ignore_eos=True))
    engine.submit(request, lambda event: None)
    engine.step()
    assert backend.threads == 2
    host.run(0.5, own=2, others=1.0)
    engine.step()
    assert backend.threads == 1
    for _ in range(2):
        host.run(0.5, own=1, others=0.0)
        engine.step()
    assert backend.threads == 2


def test_the_engine_leaves_the_threads_alone_when_told_not_to_adapt() -> None:
    engine = Engine(FakeBackend(n_threads=2), adapt_threads=False)
    assert engine.cpu_share is None


def test_the_governor_keeps_a_decode_cost_curve_per_thread_count() -> None:
    engine = Engine(FakeBackend(n_threads=2), adapt_threads=False)
    governor = engine.governor
    two = governor.cost
    governor.threads_changed(1)
    assert governor.cost is not two
    one = governor.cost
    governor.threads_changed(2)
    assert governor.cost is two
    governor.threads_changed(1)
    assert governor.cost is one


def test_plugins_with_llama_contexts_of_their_own_hear_the_new_thread_count() -> None:
    heard: list[int] = []

    class DraftContext:
        @hookimpl
        def reame_threads_changed(self, threads: int) -> None:
            heard.append(threads)

    plugins = PluginHost(discover=False)
    plugins.register(DraftContext(), "draft-context")
    host = Host()
    engine = Engine(FakeBackend(n_threads=2), plugins, cpu_share=share_on(host), speculate="off")
    engine.submit(
        GenerationRequest([1, 5, 6], SamplingParams(max_tokens=4, ignore_eos=True)),
        lambda event: None,
    )
    host.run(0.5, own=2, others=1.0)
    engine.step()
    assert heard == [1]
