"""The `reame` command on the fake backend: argument handling, one-shot runs, the REPL."""

from __future__ import annotations

import argparse
import io
from collections.abc import Iterator
from typing import TextIO

import pytest
from rich.console import Console

from reame_core.backend.fake import FakeBackend
from reame_core.cli import main as cli_main
from reame_core.cli import run as cli_run
from reame_core.cli.plugins import plugins_command
from reame_core.hookspecs import hookimpl
from reame_core.hooktypes import SequenceView
from reame_core.plugins import PluginHost
from reame_core.request import SamplingParams
from reame_core.runtime import Runtime, start_runtime
from reame_core.settings import Settings


class _Stdin(io.StringIO):
    def __init__(self, text: str, tty: bool) -> None:
        super().__init__(text)
        self._tty = tty

    def isatty(self) -> bool:
        return self._tty


@pytest.fixture
def fake_runtime(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Runtime]]:
    """Make `reame run` start on the fake backend; yields the runtimes it started."""
    started: list[Runtime] = []

    def start(settings: Settings) -> Runtime:
        runtime = start_runtime(settings, backend=FakeBackend(), plugins=PluginHost(discover=False))
        started.append(runtime)
        return runtime

    monkeypatch.setattr(cli_run, "start_runtime", start)
    yield started


@pytest.mark.parametrize(
    ("words", "model", "prompt"),
    [
        (["hello", "there"], None, "hello there"),
        (["smollm2-135m", "hello"], "smollm2-135m", "hello"),
        (["./models/x.gguf"], "./models/x.gguf", ""),
        (["qwen2.5-1.5b", "Summarize", "this"], "qwen2.5-1.5b", "Summarize this"),
        (["hf:owner/repo:Q8_0", "hi"], "hf:owner/repo:Q8_0", "hi"),
        (["What is 2+2?"], None, "What is 2+2?"),
        ([], None, ""),
    ],
)
def test_first_word_is_a_model_only_if_it_is_shaped_like_one(
    words: list[str], model: str | None, prompt: str
) -> None:
    assert cli_main.split_model_and_prompt(words) == (model, prompt)


@pytest.mark.parametrize("word", ["qwen2.5-nonexistent-9b", "qwen2.5-1.5x", "./models/none"])
def test_a_model_word_that_names_nothing_is_an_error_with_suggestions(
    word: str,
    fake_runtime: list[Runtime],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr("sys.stdin", _Stdin("", tty=True))
    assert cli_main.main(["run", word, "hi"]) == 1
    err = capsys.readouterr().err
    assert f"Unknown model {word!r}" in err
    assert f"reame run smollm2-135m {word} hi" in err
    assert fake_runtime == []


def test_an_unknown_family_size_name_gets_the_closest_aliases(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("sys.stdin", _Stdin("", tty=True))
    assert cli_main.main(["run", "qwen2.5-9b", "hi"]) == 1
    assert "Did you mean qwen2.5-7b" in capsys.readouterr().err


@pytest.mark.parametrize("prompt", ["a question", "What is 2+2?"])
def test_a_quoted_prompt_is_answered_by_the_default_model(
    prompt: str, fake_runtime: list[Runtime], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("sys.stdin", _Stdin("", tty=True))
    asked: list[str] = []
    original_reply = cli_run.reply

    def reply(runtime: Runtime, conversation: cli_run.Conversation, out: TextIO) -> str:
        asked.append(conversation.messages[-1]["content"])
        return original_reply(runtime, conversation, out)

    monkeypatch.setattr(cli_run, "reply", reply)
    assert cli_main.main(["run", prompt, "--max-tokens", "4"]) == 0
    assert asked == [prompt]
    assert fake_runtime[0].settings.model == "smollm2-135m"


def test_one_shot_prints_the_answer_and_exits_zero(
    fake_runtime: list[Runtime],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr("sys.stdin", _Stdin("", tty=True))
    assert cli_main.main(["run", "hello", "--max-tokens", "6"]) == 0
    out = capsys.readouterr().out
    assert out.endswith("\n") and out.strip()
    assert not fake_runtime[0].engine.busy


class PromptRecorder:
    """Keeps the prompt of every sequence the engine starts, as text (the fake tokenizer
    maps byte b to token b)."""

    def __init__(self) -> None:
        self.prompts: list[str] = []

    @hookimpl
    def reame_sequence_started(self, seq: SequenceView) -> None:
        text = bytes(token for token in seq.prompt_tokens if token < 256)
        self.prompts.append(text.decode("utf-8", errors="replace"))


def test_piped_stdin_goes_before_the_prompt(monkeypatch: pytest.MonkeyPatch) -> None:
    recorder = PromptRecorder()

    def start(settings: Settings) -> Runtime:
        host = PluginHost(discover=False)
        host.register(recorder, "recorder")
        return start_runtime(settings, backend=FakeBackend(), plugins=host)

    monkeypatch.setattr(cli_run, "start_runtime", start)
    monkeypatch.setattr("sys.stdin", _Stdin("the document\n", tty=False))

    assert cli_main.main(["run", "Summarize:", "--max-tokens", "4"]) == 0

    [prompt] = recorder.prompts
    assert "the document\n\nSummarize:" in prompt


def test_empty_piped_input_without_prompt_is_an_error(
    fake_runtime: list[Runtime],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr("sys.stdin", _Stdin("  \n", tty=False))
    assert cli_main.main(["run", "--max-tokens", "4"]) == 1
    assert "empty prompt" in capsys.readouterr().err


def test_unknown_model_file_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("sys.stdin", _Stdin("", tty=True))
    assert cli_main.main(["run", "no-such-model.gguf", "hi"]) == 1
    assert "no-such-model.gguf" in capsys.readouterr().err


def test_invalid_flag_values_are_reported_not_raised(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main.main(["plugins", "--parallel", "0"]) == 2
    assert "parallel" in capsys.readouterr().err


def test_flags_win_over_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REAME_PARALLEL", "3")
    monkeypatch.setenv("REAME_CTX", "512")
    args = cli_main.build_parser().parse_args(["serve", "--parallel", "6"])
    settings = cli_main.settings_from(args, model=None)
    assert settings.parallel == 6
    assert settings.ctx == 512


class Painter:
    """A plugin with a setting of its own (a flag) and a command of its own."""

    def __init__(self) -> None:
        self.painted: list[Settings] = []

    @hookimpl
    def reame_add_options(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--colour", dest="plugins.painter.colour")

    @hookimpl
    def reame_add_commands(
        self, commands: argparse._SubParsersAction[argparse.ArgumentParser]
    ) -> None:
        paint = commands.add_parser("paint")
        paint.set_defaults(handler=self.paint)

    def paint(self, settings: Settings, args: argparse.Namespace) -> int:
        self.painted.append(settings)
        return 3


@pytest.fixture
def painter() -> Painter:
    return Painter()


@pytest.fixture
def painter_host(painter: Painter, monkeypatch: pytest.MonkeyPatch) -> PluginHost:
    host = PluginHost(discover=False)
    host.register(painter, "painter")
    monkeypatch.setattr(cli_main, "PluginHost", lambda: host)
    return host


def test_plugin_flag_sets_the_plugin_setting_over_the_environment(
    painter_host: PluginHost, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REAME_PLUGINS__PAINTER__COLOUR", "blue")
    monkeypatch.setenv("REAME_PLUGINS__PAINTER__BRUSH", "wide")
    args = cli_main.build_parser(painter_host).parse_args(["serve", "--colour", "red"])

    settings = cli_main.settings_from(args, model=None)

    assert settings.plugins["painter"] == {"colour": "red", "brush": "wide"}


def test_plugin_command_runs_with_settings_and_plugin_flags(
    painter: Painter, painter_host: PluginHost
) -> None:
    status = cli_main.main(["paint", "--colour", "green", "--log-level", "error"])

    assert status == 3
    assert painter.painted[0].plugins["painter"] == {"colour": "green"}
    assert painter.painted[0].log_level == "error"


class Tagger:
    """A plugin with a request field of its own, set on `reame run` by a flag."""

    def __init__(self) -> None:
        self.seen: list[dict[str, object]] = []

    @hookimpl
    def reame_request_extensions(self) -> dict[str, str]:
        return {"tag": "a label for the request"}

    @hookimpl
    def reame_add_request_options(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--tag", dest="extensions.tag", type=str.upper)

    @hookimpl
    def reame_sequence_started(self, seq: SequenceView) -> None:
        self.seen.append(dict(seq.extensions))


def test_plugin_request_flag_sets_the_field_of_each_request_the_run_makes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tagger = Tagger()
    host = PluginHost(discover=False)
    host.register(tagger, "tagger")
    monkeypatch.setattr(cli_main, "PluginHost", lambda: host)
    monkeypatch.setattr(
        cli_run,
        "start_runtime",
        lambda settings: start_runtime(settings, backend=FakeBackend(), plugins=host),
    )
    monkeypatch.setattr("sys.stdin", _Stdin("", tty=True))

    status = cli_main.main(["run", "--tag", "urgent", "--max-tokens", "3", "hello"])
    untagged = cli_main.main(["run", "--max-tokens", "3", "hello"])

    assert status == untagged == 0
    assert tagger.seen == [{"tag": "URGENT"}, {}]
    with pytest.raises(SystemExit):  # a request field, not a setting: only `run` has it
        cli_main.build_parser(host).parse_args(["serve", "--tag", "x"])


def test_repl_keeps_the_conversation_and_reuses_its_kv(fake_runtime: list[Runtime]) -> None:
    runtime = start_runtime(Settings(), backend=FakeBackend(), plugins=PluginHost(discover=False))
    try:
        lines = iter(["first question", "second question", "/bye"])
        out = io.StringIO()
        conversation = cli_run.Conversation(SamplingParams(max_tokens=5))
        assert cli_run.repl(runtime, conversation, lambda _: next(lines), out) == 0
        assert [m["role"] for m in conversation.messages] == [
            "user",
            "assistant",
            "user",
            "assistant",
        ]
        assert runtime.engine.stats.reused_tokens > 0
    finally:
        runtime.close()


def test_repl_turn_beyond_the_context_is_refused_and_forgotten(
    fake_runtime: list[Runtime],
) -> None:
    backend = FakeBackend(n_ctx_seq=64)
    runtime = start_runtime(Settings(), backend=backend, plugins=PluginHost(discover=False))
    try:
        lines = iter(["x" * 100, "short", "/bye"])
        out = io.StringIO()
        conversation = cli_run.Conversation(SamplingParams(max_tokens=5))
        assert cli_run.repl(runtime, conversation, lambda _: next(lines), out) == 0
        assert "context per sequence is 64" in out.getvalue()
        assert "/clear to start over" in out.getvalue()
        # The refused turn is forgotten; the next one is answered.
        assert [m["role"] for m in conversation.messages] == ["user", "assistant"]
        assert conversation.messages[0]["content"] == "short"
    finally:
        runtime.close()


def test_repl_answer_stops_where_the_context_ends(fake_runtime: list[Runtime]) -> None:
    runtime = start_runtime(
        Settings(), backend=FakeBackend(n_ctx_seq=64), plugins=PluginHost(discover=False)
    )
    try:
        lines = iter(["hello", "/bye"])
        conversation = cli_run.Conversation(SamplingParams(max_tokens=500, ignore_eos=True))
        assert cli_run.repl(runtime, conversation, lambda _: next(lines), io.StringIO()) == 0
        assert conversation.messages[-1]["role"] == "assistant"
    finally:
        runtime.close()


def test_repl_commands_change_settings_and_clear(fake_runtime: list[Runtime]) -> None:
    conversation = cli_run.Conversation(SamplingParams(max_tokens=5))
    conversation.messages.append({"role": "user", "content": "x"})
    out = io.StringIO()
    assert not cli_run.command("/set temperature 0.4", conversation, out)
    assert not cli_run.command("/set system Be brief.", conversation, out)
    assert not cli_run.command("/set nonsense 1", conversation, out)
    assert not cli_run.command("/clear", conversation, out)
    assert cli_run.command("/bye", conversation, out)
    assert conversation.params.temperature == 0.4
    assert conversation.system == "Be brief."
    assert conversation.messages == []
    assert "unknown setting" in out.getvalue()


def test_repl_ends_on_end_of_input(fake_runtime: list[Runtime]) -> None:
    runtime = start_runtime(Settings(), backend=FakeBackend(), plugins=PluginHost(discover=False))
    try:

        def read(_: str) -> str:
            raise EOFError

        conversation = cli_run.Conversation(SamplingParams(max_tokens=5))
        assert cli_run.repl(runtime, conversation, read, io.StringIO()) == 0
    finally:
        runtime.close()


def test_plugins_command_lists_builtins_and_installed_plugins() -> None:
    buffer = io.StringIO()
    plugins_command(Settings(disable_plugins=["palimpsest"]), Console(file=buffer, width=200))
    table = buffer.getvalue()
    for name in ("verification", "selection", "diskkv", "suggeritore", "conclave"):
        assert name in table
    palimpsest_row = next(line for line in table.splitlines() if "palimpsest" in line)
    assert "disabled" in palimpsest_row
