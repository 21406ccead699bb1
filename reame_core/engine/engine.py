"""The engine: one thread that owns the backend and advances every request, one step at a time.

Each step it takes new requests in, ends the cancelled ones, admits waiting ones into free
slots, then asks the scheduler what to decode, has the runner decode it and the committer
turn the rows into tokens and events (see `scheduler.py`, `runner.py`, `committer.py`).
Callers talk to it only through `submit` (thread-safe) and the events it emits; nothing
outside this thread touches the backend. It owns the thread and the inbox between the
callers and that thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import queue
import threading
from collections.abc import AsyncIterator, Callable, Collection

import structlog

from reame_core.backend.base import Backend
from reame_core.engine.committer import Committer
from reame_core.engine.cpu_share import CpuShare
from reame_core.engine.governor import Governor, Mode
from reame_core.engine.runner import ModelRunner
from reame_core.engine.scheduler import Scheduler
from reame_core.engine.sequence import RequestGroup
from reame_core.engine.slots import KVSlots
from reame_core.engine.stats import EngineStats
from reame_core.errors import RequestError
from reame_core.hooktypes import CandidatePlan, DraftCost
from reame_core.plugins import PluginHost
from reame_core.request import (
    Event,
    FinishEvent,
    GenerationRequest,
    TokenEvent,
    check_request,
)

log = structlog.get_logger(__name__)

_WAKE = object()
# How often a request waiting for a prefix another process is computing asks again, when
# nothing else runs.
WAITING_POLL_S = 0.005


class Ticket:
    """A submitted request, as its submitter holds it."""

    def __init__(self, engine: Engine, group: RequestGroup) -> None:
        self._engine = engine
        self._group = group

    @property
    def request_id(self) -> str:
        return self._group.request.request_id

    def cancel(self) -> None:
        self._engine._cancel(self._group)


class Engine:
    def __init__(
        self,
        backend: Backend,
        plugins: PluginHost | None = None,
        *,
        prefill_chunk: int = 128,
        draft_max: int = 32,
        speculate: Mode = "auto",
        max_sessions: int | None = None,
        sessions_first: bool = True,
        exact_reuse: bool = True,
        rows_exact: bool = False,
        cpu_share: CpuShare | None = None,
        adapt_threads: bool = True,
    ) -> None:
        self.backend = backend
        self.info = backend.info
        self.plugins = plugins or PluginHost(discover=False)
        self.hook = self.plugins.hook
        # Where a row does not depend on its pass (`backend.pass_check`), a generated answer's
        # KV is what a prompt chunk would compute: reused as it is, like fast mode's.
        self.slots = KVSlots(backend, max_sessions, exact_reuse=exact_reuse and not rows_exact)
        draft_sources = {
            impl.plugin_name: impl for impl in self.hook.reame_propose_drafts.get_hookimpls()
        }
        self.governor = Governor(
            list(draft_sources),
            backend.passes,
            mode=speculate,
            draft_max=draft_max,
            threads=backend.info.n_threads,
        )
        self._sources_priced = False  # `reame_draft_cost` asked (on the engine thread)
        self.stats = EngineStats()
        if cpu_share is None and adapt_threads:
            cpu_share = CpuShare(self.info.n_threads, len(os.sched_getaffinity(0)))
        if cpu_share is not None and cpu_share.active:
            backend.set_threads(cpu_share.threads)  # an earlier engine may have changed it
        self.scheduler = Scheduler(
            self.slots,
            self.info,
            self.hook,
            self.governor,
            draft_sources,
            self.stats,
            prefill_chunk,
            sessions_first=sessions_first,
        )
        self.runner = ModelRunner(
            backend, self.slots, self.governor, self.hook, self.stats, cpu_share
        )
        self.committer = Committer(
            backend,
            self.slots,
            self.scheduler,
            self.governor,
            self.plugins,
            self.stats,
            recall=exact_reuse,
        )
        self._inbox: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._stopping = False

    def _price_sources(self, only: Collection[str] | None = None) -> None:
        """Give the governor what the draft sources (`only` these, if given) say their
        calls cost (`reame_draft_cost`): all before the first step, and one priced out by
        its figure again now and then (`Governor.reprice_due`); on the thread that decodes:
        a draft model times its own decodes there, as its calls will run (a second thread
        decoding would leave its idle OpenMP workers spinning beside this one's). A plugin
        that fails to say before the first step is called to find out instead; one that
        fails to say again keeps its last figure until `RETIME_AFTER` more steps."""
        self._sources_priced = True
        costs: dict[str, DraftCost] = {}
        for impl in self.hook.reame_draft_cost.get_hookimpls():
            if impl.plugin_name not in self.governor.sources:
                continue
            if only is not None and impl.plugin_name not in only:
                continue
            try:
                cost = impl.function()
            except Exception:
                log.exception("draft source could not say its cost", source=impl.plugin_name)
                continue
            if cost is not None:
                costs[impl.plugin_name] = cost
        self.governor.learn_costs(costs)

    # ------------------------------------------------------------ public API

    def start(self) -> Engine:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="reame-engine", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        """Finish the engine thread; pending requests end as cancelled."""
        if self._thread is not None:
            self._stopping = True
            self._inbox.put(_WAKE)
            self._thread.join()
            self._thread = None
        self.hook.reame_shutdown()

    def submit(
        self,
        request: GenerationRequest,
        emit: Callable[[Event], None],
        *,
        checked: bool = False,
        plan: CandidatePlan | None = None,
    ) -> Ticket:
        """Queue a request (any thread). Raises RequestError if it cannot be served; with
        `checked`, the caller has run `check` on it already and passes the `plan` that
        returned (the server does, before the request takes a place in its queue)."""
        if not checked:
            plan = self.check(request)
        if plan is not None and plan.temperature is not None and "temperature" in request.unset:
            params = dataclasses.replace(request.params, temperature=plan.temperature)
            request = dataclasses.replace(request, params=params)
        group = RequestGroup(request, emit, plan)
        self._inbox.put(group)
        return Ticket(self, group)

    def check(
        self, request: GenerationRequest, *, prompt_param: str = "prompt"
    ) -> CandidatePlan | None:
        """Refuse a request this engine cannot serve (any thread): the model's limits
        (`check_request`), then the plugins' (hook `reame_check_request`), then the plan a
        selecting plugin makes for its candidates, which it returns."""
        check_request(request, self.info, prompt_param=prompt_param)
        self.hook.reame_check_request(request=request, model=self.info)
        return self._plan(request)

    def _plan(self, request: GenerationRequest) -> CandidatePlan | None:
        """The candidates a plugin wants the request run as (hook `reame_plan_candidates`)."""
        plan: CandidatePlan | None = self.hook.reame_plan_candidates(
            request=request, model=self.info
        )
        if plan is None:
            return None
        if plan.candidates < request.n:
            raise RequestError(
                f"This request would run as {plan.candidates} candidates but asks for "
                f"{request.n} choices.",
                param="n",
            )
        if not 1 <= plan.width <= self.info.n_seq_max:
            raise RequestError(
                f"This request would run {plan.width} candidates at once; the server runs "
                f"{self.info.n_seq_max} sequence slots.",
                param="n",
            )
        return plan

    def generate(
        self, request: GenerationRequest, on_event: Callable[[TokenEvent], None] | None = None
    ) -> FinishEvent:
        """Submit and wait (blocking). The engine thread must be running. Interrupted
        (Ctrl-C), the request is cancelled and `on_event` hears nothing more of it: tokens
        the engine commits before it sees the cancellation are not shown after the prompt
        that follows."""
        finished: list[FinishEvent] = []
        done = threading.Event()
        interrupted = threading.Event()

        def emit(event: Event) -> None:
            if isinstance(event, FinishEvent):
                finished.append(event)
                done.set()
            elif on_event is not None and not interrupted.is_set():
                on_event(event)

        ticket = self.submit(request, emit)
        try:
            done.wait()
        except BaseException:
            interrupted.set()
            ticket.cancel()
            raise
        return finished[0]

    async def stream(self, request: GenerationRequest) -> AsyncIterator[Event]:
        """Submit and yield events; leaving the iteration early cancels the request."""
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[Event] = asyncio.Queue()

        def emit(event: Event) -> None:
            loop.call_soon_threadsafe(events.put_nowait, event)

        ticket = self.submit(request, emit)
        finished = False
        try:
            while not finished:
                event = await events.get()
                finished = isinstance(event, FinishEvent)
                yield event
        finally:
            if not finished:
                ticket.cancel()

    def _cancel(self, group: RequestGroup) -> None:
        group.cancelled = True
        self._inbox.put(_WAKE)

    @property
    def busy(self) -> bool:
        scheduler = self.scheduler
        return bool(scheduler.running or scheduler.waiting or self.slots.stale_session())

    @property
    def cpu_share(self) -> CpuShare | None:
        return self.runner.cpu_share

    # ------------------------------------------------------------ the loop

    def _run(self) -> None:
        self._price_sources()
        while not self._stopping:
            if not self.busy:
                self.runner.idle()
                self._take_inbox(block=True)
                self.runner.resumed()
            if self._stopping:
                break
            try:
                progressed = self.step()
            except Exception as error:
                # Whatever went wrong, the thread must live on: every request depends on it.
                with contextlib.suppress(Exception):
                    log.exception("engine step failed; failing the requests in flight")
                self._fail_all(f"internal error in the engine ({type(error).__name__})")
                continue
            if not progressed and self.busy:
                # Nothing to compute, yet requests run: they wait for a prefix another
                # process is computing. Look again after a pause, or at the next request.
                self._take_inbox(block=True, timeout=WAITING_POLL_S)
        for group in [*self.scheduler.running, *self.scheduler.waiting]:
            group.cancelled = True
        self._reap_cancelled()

    def _take_inbox(self, block: bool, timeout: float | None = None) -> None:
        if not block and self._inbox.empty():  # most steps: cheaper than a raised Empty
            return
        try:
            item = self._inbox.get(block=block, timeout=timeout)
            while True:
                if isinstance(item, RequestGroup):
                    self.stats.requests_submitted += 1
                    if not self.committer.recall(item):
                        self.scheduler.add(item)
                item = self._inbox.get_nowait()
        except queue.Empty:
            return

    def step(self) -> bool:
        """Advance every request by one decode. Returns False when there was nothing to do."""
        if not self._sources_priced:
            self._price_sources()
        elif due := self.governor.reprice_due():
            self._price_sources(due)
        self._take_inbox(block=False)
        self._reap_cancelled()
        # Waiting requests take free slots before a running one's later candidates, unless
        # those have waited their turn (the same bound as a wide request's).
        self.committer.start_later(self.scheduler.overdue())
        self._admit()
        self.committer.start_later(self.scheduler.running)
        calls = self.scheduler.schedule()
        if not calls:
            return self.runner.refresh_session()
        runner, committer = self.runner, self.committer
        for call in calls:
            decoded = runner.run(call)
            if decoded is None:
                for item in call.planned:
                    committer.fail(item.seq.group, "the model could not decode this request")
            else:
                committer.take(call.planned, *decoded)
        committer.select_each_step(self.scheduler.running)
        committer.settle()
        runner.fit_threads()
        return True

    # ------------------------------------------------- admission and endings

    def _admit(self) -> None:
        while (group := self.scheduler.next_admissible()) is not None:
            try:
                if group.request.session_id is not None:  # its turn came before idle time
                    self.runner.refresh_session(group.request.session_id)
                self.scheduler.start(group)
            except Exception as error:  # one bad request must not wedge its slots
                self.committer.fault(group, error)

    def _reap_cancelled(self) -> None:
        for group in self.scheduler.take_cancelled_waiting():
            self.committer.complete(group)
        for group in self.scheduler.cancelled_running():
            try:
                self.committer.cancel(group)
            except Exception as error:  # a plugin's hook, ending a sequence
                self.committer.fault(group, error)

    def _fail_all(self, message: str) -> None:
        for group in list(self.scheduler.running):
            self.committer.fail(group, message)
