"""A plugin whose hook raises fails the one request it was handling, with an OpenAI-shaped
error that names the plugin and the hook; the server, the other requests in flight and the
slots are untouched, and the next requests are served. A hook that serves no one request
costs the plugin instead: a draft source that raises is asked no more, a plugin whose
`reame_configure` raises is disabled, each with the reason logged.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import pytest
from api_errors import openai_error
from litestar import Litestar
from litestar.testing import TestClient

from reame_core.backend.fake import EOS, FakeBackend
from reame_core.engine.engine import Engine
from reame_core.errors import SettingsError
from reame_core.hookspecs import hookimpl
from reame_core.hooktypes import DraftProposal, DraftRequest, ModelInfo, SequenceView
from reame_core.plugins import PluginHost
from reame_core.request import FinishEvent, GenerationRequest, SamplingParams
from reame_core.runtime import start_runtime
from reame_core.server.service import ServerState
from reame_core.settings import Settings

Client = TestClient[Litestar]
CHAT = "/v1/chat/completions"
_model = FakeBackend()


class Faulty:
    """Every hook a plugin may implement, each working, except the one a request names in
    its ``fault`` field: that one raises for that request. The hooks that see no request
    (prefix store) raise while `armed` names them."""

    def __init__(self) -> None:
        self.armed: str | None = None

    @staticmethod
    def _fault(hook: str, extensions: Mapping[str, Any]) -> None:
        if extensions.get("fault") == hook:
            raise RuntimeError(f"{hook} broke")

    def _armed(self, hook: str) -> None:
        if self.armed == hook:
            raise RuntimeError(f"{hook} broke")

    @hookimpl
    def reame_request_extensions(self) -> Mapping[str, str]:
        return {"fault": "the hook that raises for this request"}

    @hookimpl
    def reame_check_request(self, request: GenerationRequest, model: ModelInfo) -> None:
        self._fault("reame_check_request", request.extensions)

    @hookimpl
    def reame_plan_candidates(self, request: GenerationRequest, model: ModelInfo) -> None:
        self._fault("reame_plan_candidates", request.extensions)

    @hookimpl
    def reame_sequence_started(self, seq: SequenceView) -> None:
        self._fault("reame_sequence_started", seq.extensions)

    @hookimpl
    def reame_constrain_logits(
        self, seq: SequenceView, pending: Sequence[int], logits: np.ndarray
    ) -> None:
        self._fault("reame_constrain_logits", seq.extensions)

    @hookimpl
    def reame_tokens_committed(self, seq: SequenceView, tokens: Sequence[int]) -> None:
        # From the third token on: the request has streamed some text already.
        if len(seq.output_tokens) >= 3:
            self._fault("reame_tokens_committed", seq.extensions)

    @hookimpl
    def reame_generation_finished(self, seq: SequenceView, finish_reason: str, text: str) -> None:
        self._fault("reame_generation_finished", seq.extensions)

    @hookimpl
    def reame_propose_drafts(self, requests: Sequence[DraftRequest]) -> list[DraftProposal]:
        proposals = []
        for request in requests:
            self._fault("reame_propose_drafts", request.seq.extensions)
            tokens = [*request.seq.prompt_tokens, *request.seq.output_tokens]
            guess = int(np.argmax(_model.logits_after(tokens)))  # right: drafts are accepted
            proposals.append(DraftProposal(request.seq, "faulty", (guess,)))
        return proposals

    @hookimpl
    def reame_verify_drafts(self, seq: SequenceView, **_: Any) -> None:
        self._fault("reame_verify_drafts", seq.extensions)  # then the built-in verifies

    @hookimpl
    def reame_drafts_verified(self, seq: SequenceView, **_: Any) -> None:
        self._fault("reame_drafts_verified", seq.extensions)

    @hookimpl
    def reame_select_candidates(self, request: GenerationRequest, **_: Any) -> None:
        self._fault("reame_select_candidates", request.extensions)

    @hookimpl
    def reame_prefix_store_points(self, tokens: Sequence[int], model: ModelInfo) -> list[int]:
        self._armed("reame_prefix_store_points")
        return [len(tokens) // 2] if len(tokens) > 8 else []

    @hookimpl
    def reame_prefix_lookup(self, tokens: Sequence[int], reused: int, model: ModelInfo) -> None:
        self._armed("reame_prefix_lookup")

    @hookimpl
    def reame_prefix_store(self, tokens: Sequence[int], state: bytes, model: ModelInfo) -> None:
        self._armed("reame_prefix_store")


@pytest.fixture
def faulty() -> Faulty:
    return Faulty()


@pytest.fixture
def client(serve: Callable[..., Client], plugins: PluginHost, faulty: Faulty) -> Iterator[Client]:
    plugins.register(faulty, "faulty")
    yield serve(backend=FakeBackend(step_cost_s=0.001))


def chat(**fields: Any) -> dict[str, Any]:
    return {
        "messages": [{"role": "user", "content": "Tell me about the sea, and the ships on it."}],
        "max_tokens": 8,
        "temperature": 0,
        **fields,
    }


def state_of(client: Client) -> ServerState:
    state: ServerState = client.app.state.server
    return state


def assert_serves_the_next_requests(client: Client) -> None:
    """Two more requests are answered, and afterwards no slot or queue place is held."""
    for _ in range(2):
        response = client.post(CHAT, json=chat())
        assert response.status_code == 200, response.text
        assert response.json()["choices"][0]["message"]["content"]
    state = state_of(client)
    assert state.in_flight == 0
    runtime = state.ready()
    assert runtime.engine.slots.free_count() == runtime.backend.info.n_seq_max


ENGINE_HOOKS = [
    ("reame_sequence_started", {}),
    ("reame_constrain_logits", {}),
    ("reame_tokens_committed", {}),
    ("reame_generation_finished", {}),
    ("reame_verify_drafts", {"speculate": "on"}),
    ("reame_drafts_verified", {"speculate": "on"}),
    ("reame_select_candidates", {"n": 2}),
]


@pytest.mark.parametrize(("hook", "fields"), ENGINE_HOOKS, ids=[h for h, _ in ENGINE_HOOKS])
def test_a_hook_that_raises_fails_its_request_and_names_the_plugin(
    client: Client, hook: str, fields: dict[str, Any]
) -> None:
    error = openai_error(client.post(CHAT, json=chat(fault=hook, **fields)), 500)
    assert error["type"] == "server_error"
    assert f"plugin 'faulty' ({hook}) raised RuntimeError" in error["message"]
    assert "broke" not in error["message"]  # the exception's own text stays in the log
    assert_serves_the_next_requests(client)


@pytest.mark.parametrize("hook", ["reame_check_request", "reame_plan_candidates"])
def test_a_check_that_raises_is_a_500_before_the_request_is_queued(
    client: Client, hook: str
) -> None:
    error = openai_error(client.post(CHAT, json=chat(fault=hook)), 500)
    assert error["type"] == "server_error"
    assert state_of(client).in_flight == 0
    assert_serves_the_next_requests(client)


def test_a_stream_whose_hook_raises_ends_with_an_error_event(client: Client) -> None:
    body = chat(fault="reame_tokens_committed", stream=True, max_tokens=20)
    with client.stream("POST", CHAT, json=body) as response:
        assert response.status_code == 200
        events = [line.removeprefix("data: ") for line in response.iter_lines() if line]
    assert events[-1] != "[DONE]"
    assert "plugin 'faulty' (reame_tokens_committed)" in events[-1]
    assert '"type":"server_error"' in events[-1]
    assert_serves_the_next_requests(client)


@pytest.mark.parametrize(
    "hook", ["reame_prefix_store_points", "reame_prefix_lookup", "reame_prefix_store"]
)
def test_a_prefix_store_that_raises_fails_the_request_it_was_storing_for(
    client: Client, faulty: Faulty, hook: str
) -> None:
    faulty.armed = hook
    error = openai_error(client.post(CHAT, json=chat()), 500)
    assert f"plugin 'faulty' ({hook})" in error["message"]
    faulty.armed = None
    assert_serves_the_next_requests(client)


def test_a_draft_source_that_raises_is_asked_no_more_and_its_request_is_served(
    client: Client,
) -> None:
    response = client.post(CHAT, json=chat(fault="reame_propose_drafts", speculate="on"))
    assert response.status_code == 200, response.text
    plain = client.post(CHAT, json=chat()).json()["choices"][0]["message"]["content"]
    assert response.json()["choices"][0]["message"]["content"] == plain  # drafts only save time
    sources = {s["source"]: s for s in client.get("/speculation").json()["sources"]}
    assert sources["faulty"]["state"] == "failed"
    assert "reame_propose_drafts raised RuntimeError" in sources["faulty"]["reason"]
    assert_serves_the_next_requests(client)


def test_the_requests_beside_a_failing_one_finish_as_if_it_were_not_there(
    make_engine: Callable[..., Engine],
    plugins: PluginHost,
    faulty: Faulty,
    greedy_reference: Callable[[FakeBackend, Sequence[int], int], list[int]],
) -> None:
    plugins.register(faulty, "faulty")
    engine = make_engine(plugins=plugins, speculate="off", step_cost_s=0.002)
    params = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    prompts = [[1, 5, 9, 14, 3], [1, 7, 7, 2, 30, 8], [1, 4, 4, 4]]
    finished: dict[int, FinishEvent] = {}
    done = threading.Event()

    def collect(index: int) -> Callable[[Any], None]:
        def emit(event: Any) -> None:
            if isinstance(event, FinishEvent):
                finished[index] = event
                if len(finished) == len(prompts):
                    done.set()

        return emit

    for index, prompt in enumerate(prompts):
        fault = {"fault": "reame_tokens_committed"} if index == 1 else {}
        engine.submit(GenerationRequest(prompt, params, extensions=fault), collect(index))
    assert done.wait(timeout=30)

    assert finished[1].error is not None and "reame_tokens_committed" in finished[1].error
    for index in (0, 2):
        assert finished[index].error is None
        expected = greedy_reference(engine.backend, prompts[index], 40)  # type: ignore[arg-type]
        assert list(finished[index].candidates[0].tokens) == expected


class BrokenConfigure:
    @hookimpl
    def reame_configure(self, settings: Settings, model: ModelInfo, hook: Any) -> None:
        raise OSError("the plugin's directory is not writable")

    @hookimpl
    def reame_request_extensions(self) -> Mapping[str, str]:
        return {"broken": "a field of the plugin that failed to configure"}


def test_a_plugin_whose_configure_raises_is_disabled_with_the_reason(
    plugins: PluginHost,
) -> None:
    plugins.register(BrokenConfigure(), "broken")
    runtime = start_runtime(Settings(), backend=FakeBackend(), plugins=plugins)
    try:
        record = next(r for r in plugins.records() if r.name == "broken")
        assert not record.enabled
        assert "reame_configure raised OSError" in record.error
        assert "broken" not in runtime.request_extensions  # its field is refused again
        finish = runtime.engine.generate(GenerationRequest([1, 2, 3], SamplingParams(4)))
        assert finish.error is None and len(finish.candidates[0].tokens) == 4
    finally:
        runtime.close()


class RefusesItsSettings:
    @hookimpl
    def reame_configure(self, settings: Settings, model: ModelInfo, hook: Any) -> None:
        raise SettingsError("[plugins.refuser] 'depth' must be at most 8")


def test_a_plugin_that_refuses_what_the_user_configured_stops_the_start(
    plugins: PluginHost,
) -> None:
    # A mistake in the configuration is said at start, not hidden by running without it.
    plugins.register(RefusesItsSettings(), "refuser")
    with pytest.raises(SettingsError, match="'depth' must be at most 8"):
        start_runtime(Settings(), backend=FakeBackend(), plugins=plugins)


class ShortSecondCandidate:
    """Candidate 1 of a request with ``short`` ends after two tokens; candidate 0 of a
    request with ``fault`` raises at its tenth."""

    def __init__(self) -> None:
        self.short_one_ended = threading.Event()

    @hookimpl
    def reame_request_extensions(self) -> Mapping[str, str]:
        return {"short": "candidate 1 ends early", "fault": "candidate 0 raises late"}

    @hookimpl
    def reame_constrain_logits(
        self, seq: SequenceView, pending: Sequence[int], logits: np.ndarray
    ) -> None:
        if seq.extensions.get("short") and seq.candidate == 1 and len(seq.output_tokens) >= 2:
            logits[:] = -np.inf
            logits[EOS] = 0.0

    @hookimpl
    def reame_tokens_committed(self, seq: SequenceView, tokens: Sequence[int]) -> None:
        if seq.extensions.get("fault") and seq.candidate == 0 and len(seq.output_tokens) >= 10:
            raise RuntimeError("late fault")

    @hookimpl
    def reame_generation_finished(self, seq: SequenceView, finish_reason: str, text: str) -> None:
        if seq.extensions.get("short") and seq.candidate == 1:
            self.short_one_ended.set()


def test_a_failing_request_leaves_the_slot_its_finished_candidate_gave_back_alone(
    make_engine: Callable[..., Engine],
    plugins: PluginHost,
    greedy_reference: Callable[[FakeBackend, Sequence[int], int], list[int]],
) -> None:
    """Request A's candidate 1 finishes and frees its slot; B takes it; then A fails. B's
    KV is B's: failing A must not clear it."""
    plugin = ShortSecondCandidate()
    plugins.register(plugin, "short")
    engine = make_engine(plugins=plugins, speculate="off", n_seq_max=2, step_cost_s=0.005)
    params = SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=False)
    a = GenerationRequest([1, 5, 9, 14], params, n=2, extensions={"short": 1, "fault": 1})
    results: dict[str, FinishEvent] = {}
    both = threading.Event()

    def keep(name: str) -> Callable[[Any], None]:
        def emit(event: Any) -> None:
            if isinstance(event, FinishEvent):
                results[name] = event
                if len(results) == 2:
                    both.set()

        return emit

    engine.submit(a, keep("a"))
    assert plugin.short_one_ended.wait(timeout=30)
    b_prompt = [1, 7, 7, 2, 30, 8]
    engine.submit(GenerationRequest(b_prompt, params), keep("b"))
    assert both.wait(timeout=30)

    assert results["a"].error is not None and "late fault" not in results["a"].error
    assert results["b"].error is None
    expected = greedy_reference(engine.backend, b_prompt, 30)  # type: ignore[arg-type]
    assert list(results["b"].candidates[0].tokens) == expected
