"""The measured code of each workload: one arm, run in the trial's own process.

A `Lab` starts what an arm measures exactly as `reame serve` would start it (settings, host
plan, build check, plugins by entry point), registering only the plugins the arm needs so
that nothing else drafts, archives or caches behind the figure; an arm that measures the
server itself starts `reame serve` as a process. Tests give the lab a fake backend, plugin
instances, a server and a token count instead; the arms do not know the difference.

Rates are generated tokens per second of decoding, from the engine's own accounting
(prompt time excluded) unless a docstring says otherwise.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from importlib import metadata
from pathlib import Path
from typing import Any, Literal

from reame_core.backend.base import Backend, Batch
from reame_core.bench import texts
from reame_core.bench.against import Server, reame_server
from reame_core.bench.replay import replay_sample
from reame_core.bench.trace import BENCH_PACE, Count, token_counter, trace_for
from reame_core.bench.trial import Sample, Trial
from reame_core.bench.workloads import BEST_OF
from reame_core.chat import encode_chat
from reame_core.plugins import ENTRY_POINT_GROUP, PluginHost
from reame_core.request import FinishEvent, GenerationRequest, SamplingParams, TokenEvent
from reame_core.runtime import Runtime, start_runtime
from reame_core.settings import Settings

Speculate = Literal["auto", "on", "off"]
TEMPERATURE = 0.7  # best-of-N's candidates and the single answer it is compared with


def installed_plugin(name: str) -> object:
    """The plugin an installed distribution registers under `name` (group ``reame``)."""
    for entry_point in metadata.entry_points(group=ENTRY_POINT_GROUP, name=name):
        return entry_point.load()
    raise LookupError(f"no installed plugin named {name!r}")


# Starts a server with these flags and this environment added; yields it while it runs.
Serve = Callable[[Sequence[str], Mapping[str, str]], AbstractContextManager[Server]]


class Lab:
    """Starts runtimes, backends and servers for one trial. `backend` replaces loading the
    model (a fresh one per call); `plugin` finds a plugin object by name; `serve` replaces
    `reame serve` of the trial's model; `counter` the model's tokenizer."""

    def __init__(
        self,
        trial: Trial,
        *,
        backend: Callable[[], Backend] | None = None,
        plugin: Callable[[str], object] = installed_plugin,
        serve: Serve | None = None,
        counter: Callable[[], AbstractContextManager[Count]] | None = None,
    ) -> None:
        self.trial = trial
        self._backend = backend
        self._plugin = plugin
        self._serve = serve
        self._counter = counter

    def serve(self, flags: Sequence[str], env: Mapping[str, str]) -> AbstractContextManager[Server]:
        if self._serve is not None:
            return self._serve(flags, env)
        threads = ["--threads", str(self.trial.threads)] if self.trial.threads else []
        return reame_server(self.trial.model, *threads, *flags, env=env)

    def counter(self) -> AbstractContextManager[Count]:
        if self._counter is not None:
            return self._counter()
        return token_counter(self.trial.model)

    def settings(self, speculate: Speculate = "off", **overrides: Any) -> Settings:
        return Settings(
            model=self.trial.model,
            threads=self.trial.threads,
            speculate=speculate,
            log_level="warning",
            **overrides,
        )

    def start(
        self,
        *,
        speculate: Speculate = "off",
        plugins: Mapping[str, dict[str, Any]] | None = None,
        parallel: int | None = None,
        draft_model: str | None = None,
    ) -> Runtime:
        """A runtime with the built-in plugins and `plugins` (name: settings section)."""
        host = PluginHost(discover=False)
        for name in plugins or {}:
            host.register(self._plugin(name), name)
        settings = self.settings(
            speculate, plugins=dict(plugins or {}), parallel=parallel, draft_model=draft_model
        )
        backend = self._backend() if self._backend is not None else None
        return start_runtime(settings, backend=backend, plugins=host)

    def backend(self) -> Backend:
        """The model alone, loaded as a runtime would load it, with no engine."""
        if self._backend is not None:
            return self._backend()
        from reame_core.backend.probe import ensure_build_runs
        from reame_core.runtime import load_backend, prepare

        settings = self.settings()
        build = ensure_build_runs(settings)
        preparation = prepare(settings, build=build)
        return load_backend(settings, preparation, use_extra_bufts=build.use_extra_bufts)

    def scratch(self, name: str) -> str:
        path = Path(self.trial.scratch) / name
        path.mkdir(parents=True, exist_ok=True)
        return str(path)


# ------------------------------------------------------------------ helpers


def _chat(runtime: Runtime, text: str, system: str | None = None) -> list[int]:
    messages = [{"role": "system", "content": system}] if system else []
    messages.append({"role": "user", "content": text})
    return encode_chat(runtime.backend.info, messages)


def _digest(outputs: Sequence[Sequence[int]]) -> str:
    return hashlib.sha256(json.dumps([list(o) for o in outputs]).encode()).hexdigest()[:16]


def _finished(runtime: Runtime, request: GenerationRequest) -> FinishEvent:
    result = runtime.engine.generate(request)
    if result.error is not None:
        raise RuntimeError(result.error)
    return result


def _decode_rate(results: Sequence[FinishEvent], *, greedy: bool, seconds: float) -> Sample:
    """Generated tokens over the engine's decode time, with the drafts' account."""
    tokens = sum(r.usage.completion_tokens for r in results)
    decode_s = sum(r.usage.predicted_ms for r in results) / 1000
    proposed = sum(sum(r.usage.draft_proposed.values()) for r in results)
    accepted = sum(sum(r.usage.draft_accepted.values()) for r in results)
    return Sample(
        value=tokens / decode_s if decode_s > 0 else 0.0,
        tokens=tokens,
        seconds=seconds,
        outputs=_digest([r.candidates[0].tokens for r in results]) if greedy else None,
        detail={"drafts_proposed": proposed, "drafts_accepted": accepted},
    )


def _sequential(runtime: Runtime, requests: Sequence[GenerationRequest], *, greedy: bool) -> Sample:
    started = time.perf_counter()
    results = [_finished(runtime, request) for request in requests]
    return _decode_rate(results, greedy=greedy, seconds=time.perf_counter() - started)


def _wait_ready(runtime: Runtime, name: str, timeout: float = 120) -> None:
    """Until the plugin's stats say it is ready (an archive's index loaded)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        stats: dict[str, Any] = {}
        for each in runtime.plugins.hook.reame_collect_stats():
            stats.update(each or {})
        if stats.get(name, {}).get("ready", True):
            return
        time.sleep(0.02)
    raise RuntimeError(f"plugin {name} was not ready after {timeout} s")


# ------------------------------------------------------------------ the arms


def decode(lab: Lab) -> Sample:
    """A: the engine, one greedy stream, speculation off. B: the plainest loop over the same
    llama.cpp context (decode one token, argmax, repeat). Wall time of the whole request,
    the same short prompt in both, so the prompt costs both the same."""
    size = lab.trial.size
    if lab.trial.arm == "B":
        backend = lab.backend()
        try:
            prompt = backend.tokenize(texts.STORIES[0], add_special=True, parse_special=False)
            _raw_loop(backend, prompt, 8)  # warm up, as the engine's arm does
            backend.seq_rm(0, -1, -1)
            started = time.perf_counter()
            outputs = _raw_loop(backend, prompt, size.tokens)
            seconds = time.perf_counter() - started
        finally:
            backend.close()
        return Sample(size.tokens / seconds, size.tokens, seconds, _digest([outputs]))
    runtime = lab.start()
    try:
        prompt = runtime.backend.tokenize(texts.STORIES[0], add_special=True, parse_special=False)
        warm_up = runtime.backend.tokenize("Warm up.", add_special=True, parse_special=False)
        _finished(runtime, GenerationRequest(warm_up, SamplingParams(max_tokens=8)))
        params = SamplingParams(max_tokens=size.tokens, ignore_eos=True)
        started = time.perf_counter()
        result = _finished(runtime, GenerationRequest(prompt, params))
        seconds = time.perf_counter() - started
    finally:
        runtime.close()
    tokens = result.usage.completion_tokens
    return Sample(tokens / seconds, tokens, seconds, _digest([result.candidates[0].tokens]))


def _raw_loop(backend: Backend, prompt: Sequence[int], n_tokens: int) -> list[int]:
    """Greedy decoding of sequence 0 with nothing but `Backend.decode`: the prompt in
    chunks of at most n_batch (llama.cpp aborts past it), then one token per call."""
    n_batch = backend.info.n_batch
    for start in range(0, len(prompt), n_batch):
        batch = Batch()
        for position in range(start, min(start + n_batch, len(prompt))):
            batch.add(prompt[position], position, 0, position == len(prompt) - 1)
        logits = backend.decode(batch)
    token = int(logits[0].argmax())
    outputs = [token]
    for position in range(len(prompt), len(prompt) + n_tokens - 1):
        step = Batch()
        step.add(token, position, 0, True)
        token = int(backend.decode(step)[0].argmax())
        outputs.append(token)
    return outputs


def streams(lab: Lab) -> Sample:
    """A: the requests at once, interleaved in the engine's batch. B: one after another.
    Aggregate generated tokens over the wall time of all of them."""
    size = lab.trial.size
    runtime = lab.start(parallel=size.requests)
    try:
        backend = runtime.backend
        prompts = [
            backend.tokenize(text, add_special=True, parse_special=False)
            for text in texts.STORIES[: size.requests]
        ]
        warm_up = backend.tokenize("Warm up.", add_special=True, parse_special=False)
        _finished(runtime, GenerationRequest(warm_up, SamplingParams(max_tokens=8)))
        params = SamplingParams(max_tokens=size.tokens, ignore_eos=True)
        results: list[FinishEvent | None] = [None] * len(prompts)

        def one(i: int) -> None:
            results[i] = _finished(runtime, GenerationRequest(prompts[i], params))

        started = time.perf_counter()
        if lab.trial.arm == "A":
            workers = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
            for worker in workers:
                worker.start()
            for worker in workers:
                worker.join()
        else:
            for i in range(len(prompts)):
                one(i)
        seconds = time.perf_counter() - started
    finally:
        runtime.close()
    done = [r for r in results if r is not None]
    if len(done) != len(prompts):
        raise RuntimeError("a stream did not finish")
    tokens = sum(r.usage.completion_tokens for r in done)
    return Sample(
        tokens / seconds, tokens, seconds, _digest([r.candidates[0].tokens for r in done])
    )


def diskcache(lab: Lab) -> Sample:
    """Time to first token of one question behind the handbook system prompt, in a fresh
    process. B runs first on an empty cache directory and leaves the system prompt's
    snapshot there; A finds it. Greedy, speculation off: both answers must be the same."""
    size = lab.trial.size
    runtime = lab.start(plugins={"diskkv": {"dir": lab.scratch("kv")}})
    try:
        prompt = _chat(
            runtime,
            texts.HANDBOOK_QUESTIONS[lab.trial.rep % len(texts.HANDBOOK_QUESTIONS)],
            system=texts.handbook(size.shared_rules),
        )
        first: list[float] = []

        def on_event(event: TokenEvent) -> None:
            if not first:
                first.append(time.perf_counter())

        started = time.perf_counter()
        result = runtime.engine.generate(
            GenerationRequest(prompt, SamplingParams(max_tokens=size.tokens)), on_event
        )
        seconds = time.perf_counter() - started
    finally:
        runtime.close()  # the cache's writer finishes the snapshot first
    if result.error is not None or not first:
        raise RuntimeError(result.error or "no token generated")
    usage = result.usage
    return Sample(
        first[0] - started,
        usage.completion_tokens,
        seconds,
        _digest([result.candidates[0].tokens]),
        {"prompt_tokens": usage.prompt_tokens, "restored_tokens": usage.restored_tokens},
    )


def lookup(lab: Lab) -> Sample:
    """Rewrite tasks, greedy: A drafts by prompt lookup (speculation auto), B does not."""
    size = lab.trial.size
    runtime = lab.start(speculate="auto" if lab.trial.arm == "A" else "off")
    try:
        params = SamplingParams(max_tokens=size.tokens)
        requests = [
            GenerationRequest(_chat(runtime, text), params)
            for text in texts.REWRITES[: size.requests]
        ]
        return _sequential(runtime, requests, greedy=True)
    finally:
        runtime.close()


def palimpsest(lab: Lab) -> Sample:
    """The same requests twice, each pass in a fresh process sharing the rep's archive:
    B, the first, without speculation (what it generates is archived); A, the second,
    drafting from the archive (speculation auto). Answers are not recalled whole: the
    drafting is measured."""
    size = lab.trial.size
    runtime = lab.start(
        speculate="auto" if lab.trial.arm == "A" else "off",
        plugins={"palimpsest": {"dir": lab.scratch("archive"), "recall": False}},
    )
    try:
        _wait_ready(runtime, "palimpsest")
        params = SamplingParams(max_tokens=size.tokens)
        requests = [
            GenerationRequest(_chat(runtime, text), params)
            for text in texts.REPEATED[: size.requests]
        ]
        return _sequential(runtime, requests, greedy=True)
    finally:
        runtime.close()  # the archive's writer finishes first


def conclave(lab: Lab) -> Sample:
    """Short questions, sampled at `TEMPERATURE`: A asks each for best-of-N by vote, B for
    one answer. Wall time of all the questions."""
    size = lab.trial.size
    runtime = lab.start(plugins={"conclave": {}})
    try:
        reports: list[Any] = []
        tokens = 0
        started = time.perf_counter()
        for i, text in enumerate(texts.QUIZ[: size.requests]):
            prompt = _chat(runtime, text)
            params = SamplingParams(max_tokens=size.tokens, temperature=TEMPERATURE, seed=i)
            if lab.trial.arm == "A":
                request = GenerationRequest(prompt, params, extensions={"best_of": BEST_OF})
            else:
                request = GenerationRequest(prompt, params)
            result = _finished(runtime, request)
            tokens += result.usage.completion_tokens
            reports.append(dict(result.report))
        seconds = time.perf_counter() - started
    finally:
        runtime.close()
    return Sample(seconds, tokens, seconds, detail={"votes": reports} if any(reports) else {})


def grammar(lab: Lab) -> Sample:
    """Extraction under a JSON schema, greedy: both arms constrained by the grammar; A lets
    it draft (speculation auto: forced keys and punctuation proposed for free), B does not."""
    size = lab.trial.size
    runtime = lab.start(
        speculate="auto" if lab.trial.arm == "A" else "off", plugins={"suggeritore": {}}
    )
    fields = {
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "extraction", "schema": texts.EXTRACTION_SCHEMA},
        }
    }
    try:
        params = SamplingParams(max_tokens=size.tokens)
        requests = [
            GenerationRequest(
                _chat(runtime, document, system=texts.EXTRACTION_SYSTEM), params, extensions=fields
            )
            for document in texts.DOCUMENTS[: size.requests]
        ]
        return _sequential(runtime, requests, greedy=True)
    finally:
        runtime.close()


def adversarial(lab: Lab) -> Sample:
    """Free text sampled at temperature 1.0 (seeded, ignore_eos), where prompt lookup
    proposes drafts that rarely hold: A lets the governor decide, B never drafts."""
    size = lab.trial.size
    runtime = lab.start(speculate="auto" if lab.trial.arm == "A" else "off")
    try:
        params = SamplingParams(max_tokens=size.tokens, temperature=1.0, seed=7, ignore_eos=True)
        requests = [
            GenerationRequest(_chat(runtime, text), params)
            for text in texts.ADVERSARIAL[: size.requests]
        ]
        return _sequential(runtime, requests, greedy=False)
    finally:
        runtime.close()


def draftmodel(lab: Lab) -> Sample:
    """Code completions and rewrites, greedy, alternating: A drafts with the draft model
    the trial names (speculation auto, so prompt lookup may draft too, as by default), B
    does not draft."""
    size = lab.trial.size
    if lab.trial.arm == "A":
        if lab.trial.draft is None:
            raise RuntimeError("the draftmodel workload was given no draft model")
        runtime = lab.start(speculate="auto", draft_model=lab.trial.draft)
    else:
        runtime = lab.start()
    try:
        params = SamplingParams(max_tokens=size.tokens)
        requests = []
        for i in range(size.requests):
            if i % 2 == 0:
                code = texts.CODE[i // 2 % len(texts.CODE)]
                prompt = runtime.backend.tokenize(code, add_special=True, parse_special=False)
            else:
                prompt = _chat(runtime, texts.REWRITES[i // 2 % len(texts.REWRITES)])
            requests.append(GenerationRequest(prompt, params))
        return _sequential(runtime, requests, greedy=True)
    finally:
        runtime.close()


def trace(lab: Lab) -> Sample:
    """The trace (a slice of it, `trace.trace_for`) replayed against a fresh `reame serve`
    of the model, arrivals at `trace.BENCH_PACE`, every answer streamed, greedy. A: the
    server's defaults with speculation auto, the disk prefix cache and the archive in
    directories of their own, empty at first (as on a new install). B: speculation off,
    the disk cache and the archive disabled; Il Suggeritore answers the schema in both."""
    size = lab.trial.size
    if lab.trial.arm == "A":
        flags = ["--speculate", "auto"]
        env = {
            "REAME_PLUGINS__DISKKV__DIR": lab.scratch("A-kv"),
            "REAME_PLUGINS__PALIMPSEST__DIR": lab.scratch("A-palimpsest"),
        }
    else:
        flags = ["--speculate", "off", "--disable-plugin", "diskkv"]
        flags += ["--disable-plugin", "palimpsest"]
        env = {}
    requests = trace_for(size.requests, size.tokens)
    with lab.counter() as count, lab.serve(flags, env) as server:
        return replay_sample(server, requests, BENCH_PACE, count, compare=True)


ARMS: Mapping[str, Callable[[Lab], Sample]] = {
    "decode": decode,
    "streams": streams,
    "diskcache": diskcache,
    "lookup": lookup,
    "palimpsest": palimpsest,
    "conclave": conclave,
    "grammar": grammar,
    "adversarial": adversarial,
    "draftmodel": draftmodel,
    "trace": trace,
}


def run_trial(
    trial: Trial,
    *,
    backend: Callable[[], Backend] | None = None,
    plugin: Callable[[str], object] = installed_plugin,
    serve: Serve | None = None,
    counter: Callable[[], AbstractContextManager[Count]] | None = None,
) -> Sample:
    """Run `trial` in this process."""
    lab = Lab(trial, backend=backend, plugin=plugin, serve=serve, counter=counter)
    return ARMS[trial.workload](lab)
