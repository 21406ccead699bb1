"""Every hook Reame calls, documented in one place.

Reame's own features are plugins that implement these hooks (see
`reame_core.builtins`), registered exactly like third-party plugins, which are found
through the ``reame`` entry-point group. A plugin is any module or object with
functions named like the specs below, marked with ``reame_core.hookimpl``.

Threading:

- the submitting thread (an HTTP worker thread or the event loop, several at once; the
  CLI's thread): ``reame_request_extensions``, ``reame_check_request`` and
  ``reame_plan_candidates``, before the engine sees the request: answer from their
  arguments alone;
- the thread that starts or stops Reame: ``reame_disk_need``, ``reame_configure``,
  ``reame_shutdown``, ``reame_describe`` and the command-line hooks;
- whoever reads metrics (the HTTP event loop): ``reame_collect_stats``;
- the engine thread, between two decode steps: every other hook. These must not block for
  long: each millisecond spent in one is a millisecond every running stream waits. Plugins
  that do I/O (a disk cache writing a snapshot) hand the work to their own thread.

The groups follow a run from its plan, then a request through the engine:

    planning    reame_disk_need
    lifecycle   reame_configure, reame_request_extensions, reame_check_request,
                reame_sequence_started, reame_generation_finished, reame_shutdown
    memory      reame_remember_answer, reame_recall_answer
    prefill     reame_prefix_lookup, reame_prefix_store_points, reame_prefix_store,
                reame_prefix_computing, reame_prefix_pending
    drafting    reame_propose_drafts, reame_draft_cost
    verifying   reame_constrain_logits, reame_forced_end, reame_verify_drafts
    accounting  reame_drafts_verified, reame_tokens_committed
    selection   reame_plan_candidates, reame_select_candidates
    reporting   reame_describe, reame_collect_stats
    command     reame_add_options, reame_add_request_options, reame_add_commands
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    import argparse

    import numpy as np

    from reame_core.hooktypes import (
        AnswerExtractor,
        CandidatePlan,
        CandidateView,
        DiskNeed,
        DraftCost,
        DraftProposal,
        DraftRequest,
        ModelInfo,
        PrefixHit,
        RecalledAnswer,
        Selection,
        SequenceView,
        TargetSampler,
        Verification,
    )
    from reame_core.request import GenerationRequest
    from reame_core.settings import Settings

PROJECT = "reame"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


# ----------------------------------------------------------------- planning


@hookspec
def reame_disk_need(settings: Settings) -> DiskNeed | None:
    """How much disk this plugin wants for the data it keeps there (None: it keeps none),
    and in which directory (its settings may put it on another disk than Reame's files).

    Called while the host plan is made, before the model loads, on the caller's thread.
    The plan turns each plugin's need into a budget from the free disk of that directory
    (none when too little is free), unless the plugin's settings section sets it; offers it
    as that setting's default (`Settings.plugin_section`); and `reame config` prints it on
    a line of its own. A disabled plugin is not asked.
    """


# ---------------------------------------------------------------- lifecycle


@hookspec
def reame_configure(settings: Settings, model: ModelInfo, hook: Any) -> None:
    """Called once after the model is loaded, before the first request.

    A plugin reads its own section with ``settings.plugin_section(name, Model)`` and
    prepares its state (open a cache directory, build a tokenizer for grammars). `hook`
    calls the hooks of every plugin, for one that gathers what others provide (best-of-N
    asks ``reame_answer_extractors``).
    """


@hookspec
def reame_request_extensions() -> Mapping[str, str]:
    """Name the request fields this plugin handles, with a one-line description.

    The API accepts an extension field only if an enabled plugin claims it; any other
    unknown field that would change the output is refused with a 400. Claiming OpenAI's
    ``tools`` says the plugin constrains tool calls to the functions (the API still renders
    them and reads the calls back, from `GenerationRequest.tools`): without such a plugin,
    the API refuses calls.
    """


@hookspec
def reame_check_request(request: GenerationRequest, model: ModelInfo) -> None:
    """Validate a request before it is queued; raise ``RequestError`` to refuse it."""


@hookspec
def reame_sequence_started(seq: SequenceView) -> None:
    """A candidate sequence starts generating (its prompt is in the KV cache)."""


@hookspec
def reame_generation_finished(seq: SequenceView, finish_reason: str, text: str) -> None:
    """A candidate sequence ended; its tokens are final. Called once per sequence however it
    ends, so release here what is held for ``seq.key``. `finish_reason` is "stop" or
    "length" for a complete generation (an archive may keep those); "abandoned" (stopped by
    candidate selection), "cancelled" and "error" end it cut short."""


@hookspec
def reame_remember_answer(request: GenerationRequest, key: str, answer: RecalledAnswer) -> None:
    """A request whose answer it alone fixes (`engine.recall.recallable`, in the
    deterministic configuration) ended complete: `answer` is what it returned, `key`
    (`engine.recall.answer_key`) names the request and the model configuration. A plugin
    that remembers answers keeps it, to return it from `reame_recall_answer` (unless the
    request's own fields say not to)."""


@hookspec(firstresult=True)
def reame_recall_answer(
    request: GenerationRequest, key: str, model: ModelInfo
) -> RecalledAnswer | None:
    """The answer remembered under `key`, or None: the request is computed. Asked as the
    engine takes a request that qualifies (`reame_remember_answer`), before it waits for
    a slot; an answer returned is sent as the request's whole output at once, with every
    prompt token counted as cached. Answer from memory or a quick read: each millisecond
    here delays every running stream."""


@hookspec
def reame_threads_changed(threads: int) -> None:
    """The engine decodes with `threads` CPU threads from now on: other processes took cores
    or gave them back. A plugin that computes with llama.cpp contexts of its own (a draft
    model) uses as many, or its threads stall each other beside the busy neighbours too."""


@hookspec
def reame_shutdown() -> None:
    """The engine is stopping: flush and close what the plugin holds."""


# ------------------------------------------------------------------ prefill


@hookspec(firstresult=True)
def reame_prefix_lookup(tokens: Sequence[int], reused: int, model: ModelInfo) -> PrefixHit | None:
    """Offer a stored KV state for a prompt that would otherwise be prefilled.

    `reused` prompt tokens are already available from memory; return a hit only if it
    covers more. The hit's first `n_tokens` must equal ``tokens[:n_tokens]`` (the engine
    refuses a hit that does not). A state holding more tokens than those (a snapshot of a
    longer prompt sharing `n_tokens` with this one) names all of them in `state_tokens`,
    and the engine cuts it back after restoring it. Only models with
    ``model.prefix_trim_safe`` can be cut back: for the others offer only states whose
    tokens are all a prefix of the prompt and at most ``len(tokens) - 2`` long, since the
    engine always computes the last two prompt tokens itself.

    The engine waits for the answer: keep a miss cheap (no file reads), and read only the
    state you return.
    """


@hookspec
def reame_prefix_store_points(
    tokens: Sequence[int], model: ModelInfo, session: str | None
) -> Iterable[int]:
    """Prompt lengths at which this plugin wants a KV snapshot of the prompt prefix.
    `session` is the request's session (`X-Session-ID`, `session_id`), if it names one:
    a conversation that will likely come back with another turn.

    The scheduler ends a prefill chunk at each point beyond the reused prefix, then calls
    ``reame_prefix_store``. A point is first moved back to the model's chunk grid
    (`ModelInfo.chunk_grid`), where prompt chunks start, unless the server found the model's
    rows independent of their pass (`backend.pass_check`). A point that would make a one-token
    chunk (one token past the previous point, or one before the prompt's end) is skipped: a
    lone token is computed along another kernel path. Each snapshot copies the state on the
    engine thread: name only prefixes the plugin does not hold yet.
    """


@hookspec
def reame_prefix_store(tokens: Sequence[int], state: bytes, model: ModelInfo) -> None:
    """A sequence's KV holds exactly `tokens`, computed as prompt chunks; `state` is its
    serialized state, the plugin's own copy. Compressing and writing it belongs on the
    plugin's own thread."""


@hookspec
def reame_prefix_computing(
    tokens: Sequence[int], points: Sequence[int], model: ModelInfo, request_id: str
) -> None:
    """The engine is computing the prompt `tokens` of request `request_id` and means to
    store its prefixes of the lengths `points` (each through ``reame_prefix_store``, in
    that order) as soon as they are computed. Called when a request starts with store
    points, again with the points it still means to store whenever it drops one without
    storing it, and with none once it will store no more of them (the request ended
    first). A stored point needs no call: storing it ends the promise. Two requests may
    promise one prefix: it stays promised while either means to store it.

    A plugin that other processes share (a cache directory on a common disk) tells them,
    so that a request there behind the same prefix waits for the state
    (``reame_prefix_pending``) instead of computing it a second time.
    """


@hookspec(firstresult=True)
def reame_prefix_pending(tokens: Sequence[int], have: int, model: ModelInfo) -> int | None:
    """How many leading tokens of the prompt `tokens`, more than the `have` already
    available, another process is computing and has promised to store (its
    ``reame_prefix_computing``, never this process's own): a length whose tokens are all a
    prefix of `tokens` and at most ``len(tokens) - 2``. None when nothing longer is promised.

    On an answer the engine holds the request in its slot without computing its prompt,
    asks again every step, and once the answer is None (stored, withdrawn or lapsed)
    restores what ``reame_prefix_lookup`` offers and computes the rest. It computes the
    prefix itself once it has waited about as long as computing it would take at its own
    measured rate (before it has computed a prompt, as long as the answer stands, up to a
    limit). Asked on the engine thread, every step, for every waiting request: answer from
    an index.
    """


# ----------------------------------------------------------------- drafting


@hookspec
def reame_propose_drafts(requests: Sequence[DraftRequest]) -> Iterable[DraftProposal] | None:
    """Propose continuations for some of the decoding sequences.

    Called once per step with every sequence the speculation governor lets draft. A source
    returns proposals for the sequences it has a guess for (at most ``max_tokens`` each)
    and nothing for the rest. When several sources propose for one sequence, the policy
    keeps one. Batch the work across sequences when that is cheaper (a draft model).
    A proposal marked ``certain`` (tokens the sequence's own constraint forces, see
    `DraftProposal`) is taken before any guess for its sequence, and appended without
    verification unless the request keeps logprobs. A source whose drafts come true more
    or less often in a way it can tell (the archive: by the length of the match behind the
    draft) says which ``kind`` each is, and each kind is priced on its own record.
    """


@hookspec
def reame_draft_cost() -> DraftCost | None:
    """What a call to this plugin's ``reame_propose_drafts`` costs, if the plugin knows before
    its first call (a draft model times a few of its own decodes).

    Called on the engine thread before its first step, and again whenever the source has not
    been called for 4,096 steps since (`engine.governor.RETIME_AFTER`), as a rule because
    the figure priced it out: time your decodes there, anew each time (a second thread
    decoding leaves idle OpenMP workers spinning beside the engine's; a figure taken beside
    a busy neighbour may no longer hold). The governor prices the source with it from the
    first step instead of calling it once to find out: a source whose drafts could not pay
    on this host even if every one came true is then never asked, and never made to read a
    prompt only to show that. Its timed calls replace the figure as they come: the first is
    taken as a warm-up, and three more settle the price (one slow call on a shared host does
    not condemn the source; until then it is asked again, for one request); a price from
    calls long past is settled anew. A source that returns nothing is called early in the
    first request, to learn its cost.
    """


# ---------------------------------------------------------------- verifying


@hookspec
def reame_constrain_logits(seq: SequenceView, pending: Sequence[int], logits: np.ndarray) -> None:
    """Restrict the next token of `seq` by editing `logits` in place (e.g. -inf outside a
    grammar). `pending` are draft tokens (being verified, or certain) that come before this
    position and are not yet committed: constrain as if they were.

    Called once per position the engine samples or verifies, for each candidate, always on
    the model's own row: candidates that share one prompt's logits get a copy each, so a
    constraint need not be idempotent. A row after a pending token the constraint refuses
    may be left as it is: verification stops at the earlier row, where that token was
    masked out, and never reads it."""


@hookspec(firstresult=True)
def reame_forced_end(seq: SequenceView) -> Sequence[int] | None:
    """The tokens `seq`'s constraint forces from here to its end, when nothing but they and
    then end-of-generation tokens can follow what it has committed (the closing brackets of
    a structured answer): the engine commits them without computing their steps and ends
    the sequence ("stop"), as sampling would have. ``()`` if it must end now; None if it
    may go on otherwise. Each token must be the only one the constraint admits at its place,
    as for a certain draft. Asked on the engine thread after each commit of a sequence that
    has not ended, where a plugin implements `reame_constrain_logits`, unless the request
    keeps logprobs (those tokens would have none) or ignores end-of-generation tokens."""


@hookspec(firstresult=True)
def reame_verify_drafts(
    seq: SequenceView, draft: DraftProposal, logits: np.ndarray, sampler: TargetSampler
) -> Verification | None:
    """Decide how much of `draft` the target model accepts.

    `logits` has ``len(draft.tokens) + 1`` rows, already constrained: row i is the target's
    prediction after the sequence plus the first i draft tokens. `sampler` turns a row into
    the candidate's distribution or token, drawing from its random stream. The result must
    follow the target's distribution exactly (greedy: the argmax; sampling: speculative
    rejection sampling). The built-in implementation does both; a plugin may override it
    with ``tryfirst``.
    """


# --------------------------------------------------------------- accounting


@hookspec
def reame_drafts_verified(
    seq: SequenceView, draft: DraftProposal, accepted: int, step_seconds: float
) -> None:
    """Outcome of one verified draft: how many tokens were accepted, and the wall time of
    the step that verified it (a certain draft, appended unverified, reports all of its
    tokens accepted). Sources that mirror the sequence roll back here."""


@hookspec
def reame_tokens_committed(seq: SequenceView, tokens: Sequence[int]) -> None:
    """Tokens were appended to `seq` for good (decoded, or accepted drafts). Joined, the
    calls for one sequence are exactly its output; an end-of-generation token is not
    committed."""


# ---------------------------------------------------------------- selection


@hookspec(firstresult=True)
def reame_plan_candidates(request: GenerationRequest, model: ModelInfo) -> CandidatePlan | None:
    """Plan how `request`'s candidates run, for a selecting plugin that wants other than
    its `n` candidates each streamed as it goes: best-of-N runs N and holds them back to
    return one; a voter asks to select after every step. Return None to leave it alone.

    Called once per request, after ``reame_check_request``, on the same (submitting)
    thread: answer from the request alone. A plan for fewer candidates than `n`, or running
    more at once than the server has slots, is refused (a 400).
    Requests without a plan cost selection nothing per step. See `CandidatePlan`.
    """


@hookspec(firstresult=True)
def reame_select_candidates(
    request: GenerationRequest, candidates: Sequence[CandidateView], final: bool
) -> Selection | None:
    """Choose which of a request's candidates to return.

    Called for requests with several candidates or a `CandidatePlan`. With `final` False,
    while some still run or may start: each time a candidate finishes, or, for a plan with
    ``select_each_step``, after every step in which one committed tokens or finished.
    Return a Selection with ``stop_others`` to end the unfinished candidates it does not
    choose (they finish as "abandoned"), with ``start`` to start more of the plan's
    candidates (beyond its ``at_once``), or None to wait. With `final` True, once all are
    done: the chosen candidates, at most the request's `n`, are returned, and the
    Selection's ``report`` goes into the response. The built-in default returns the first
    `n`, in order.
    """


@hookspec
def reame_answer_extractors() -> Mapping[str, AnswerExtractor] | None:
    """Ways to read the answer out of a candidate's text, by name, for plugins that
    compare candidates by their answers (best-of-N voting picks one by name). An extractor
    takes the text and the request's argument for it (a pattern, a field; None when it
    needs none) and returns the answer, normalised so equal answers compare equal, or None
    when the text holds none."""


# ---------------------------------------------------------------- reporting


@hookspec
def reame_describe() -> str:
    """One line saying what this plugin does in the running configuration."""


@hookspec
def reame_collect_stats() -> Mapping[str, Mapping[str, Any]] | None:
    """Counters for metrics and the CLI, as ``{"group": {"counter": value}}``.

    One group is read differently: ``DISK_FAULTS`` (``"disk_faults"``) maps the name of a
    store the plugin keeps on disk to its faults by kind, ``{"disk_faults": {"diskkv":
    {"corrupt_entry": 1}}}``, each a fault the store detected and worked around (a damaged
    file not used, a write the full disk refused). The server exposes them, every plugin's
    together, as one counter: ``reame_disk_faults_total{store, kind}``.
    """


# ------------------------------------------------------------- command line


@hookspec
def reame_add_options(parser: argparse.ArgumentParser) -> None:
    """Add flags for this plugin's settings to a `reame` command that loads settings.

    A flag's ``dest`` names the setting it sets, as ``"plugins.<section>.<key>"``; a value
    given on the command line lands in ``settings.plugins[section][key]``, over the
    environment and the config file. Flags are parsed before the settings say which
    plugins are disabled, so every installed plugin adds its flags.
    """


@hookspec
def reame_add_request_options(parser: argparse.ArgumentParser) -> None:
    """Add flags to `reame run` for request fields this plugin claims
    (``reame_request_extensions``), as the API takes them in a request's body.

    A flag's ``dest`` is ``"extensions.<field>"``; the value it parses to (after its
    ``type``, which may read a file) becomes ``extensions[field]`` of each request the run
    makes, checked like an API request's (``reame_check_request``). `reame run` is the only
    command that generates, so the only one that gets these flags.
    """


@hookspec
def reame_add_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `reame` subcommands with ``commands.add_parser(name, ...)``.

    Each added parser sets ``handler`` with ``set_defaults(handler=run)``, where
    ``run(settings: Settings, args: argparse.Namespace) -> int`` does the work and returns
    the exit status. The CLI gives every added command the settings flags (``--config``,
    ``--disable-plugin``, logging, and the flags of `reame_add_options`).
    """
