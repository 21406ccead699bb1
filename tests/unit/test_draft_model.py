"""The draft-model source's checks that need no model: which draft to load, from which file
(its Q4_0 copy, or the file where there is none or it does not load), and refusing a draft
whose vocabulary differs (the real-model behaviour is in tests/integration)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

import pytest

from reame_core.backend.fake import FakeBackend, FakeVocabulary
from reame_core.builtins import draft_model
from reame_core.builtins.draft_model import (
    DraftModel,
    DraftModelSettings,
    check_same_vocabulary,
    draft_model_name,
)
from reame_core.errors import ModelLoadError
from reame_core.hooktypes import DraftRequest, ModelInfo, SequenceView
from reame_core.models import draft_copy
from reame_core.settings import Settings


class EditedVocabulary(FakeVocabulary):
    """The fake vocabulary with some token pieces replaced."""

    def __init__(self, pieces: Sequence[bytes]) -> None:
        self._edited = list(pieces)

    def pieces(self) -> Sequence[bytes]:
        return self._edited


def model_with(pieces: Sequence[bytes]) -> FakeBackend:
    return FakeBackend(vocab=EditedVocabulary(pieces))


def test_auto_takes_the_partner_named_by_the_model_card() -> None:
    assert draft_model_name(Settings(model="qwen2.5-1.5b", draft_model="auto")) == "qwen2.5-0.5b"


def test_auto_loads_nothing_for_a_model_without_a_partner() -> None:
    assert draft_model_name(Settings(model="smollm2-135m", draft_model="auto")) is None


def test_an_explicit_draft_model_is_taken_as_given() -> None:
    assert draft_model_name(Settings(draft_model="/models/small.gguf")) == "/models/small.gguf"
    assert draft_model_name(Settings()) is None


def test_a_draft_with_the_same_vocabulary_is_accepted() -> None:
    check_same_vocabulary(FakeBackend().info, FakeBackend(name="draft").info)


def test_a_draft_whose_token_means_other_text_is_refused_naming_the_token() -> None:
    pieces = list(FakeVocabulary().pieces())
    pieces[97] = b"x"

    with pytest.raises(ModelLoadError, match="token 97"):
        check_same_vocabulary(model_with(pieces).info, FakeBackend(name="draft").info)


def test_a_draft_with_another_vocabulary_size_is_refused() -> None:
    with pytest.raises(ModelLoadError, match="share the target's vocabulary"):
        target = model_with(FakeVocabulary().pieces()[:-1])
        check_same_vocabulary(target.info, FakeBackend(name="draft").info)


def test_a_draft_differing_only_in_its_last_token_is_refused() -> None:
    """Every token is compared, not a sample of them."""
    pieces = list(FakeVocabulary().pieces())
    last = len(pieces) - 1
    pieces[last] = b"\xff\xfe"

    with pytest.raises(ModelLoadError, match=f"token {last}"):
        check_same_vocabulary(model_with(pieces).info, FakeBackend(name="draft").info)


class Loader:
    """Stands in for `load_draft`: a fake backend per path, or a load error for the paths
    given; records what it was asked to load."""

    def __init__(self, failing: Sequence[Path] = (), vocab: FakeVocabulary | None = None) -> None:
        self.failing = set(failing)
        self.vocab = vocab
        self.paths: list[Path] = []

    def __call__(self, path: Path, name: str, model: ModelInfo) -> FakeBackend:
        self.paths.append(path)
        if path in self.failing:
            raise ModelLoadError(f"{path} is not a model")
        backend = FakeBackend(name=name) if self.vocab is None else FakeBackend(vocab=self.vocab)
        backend.path = path  # type: ignore[attr-defined]
        return backend


@pytest.fixture
def draft_file(tmp_path: Path) -> Path:
    path = tmp_path / "small.gguf"
    path.write_bytes(b"GGUF small model")
    return path


@pytest.fixture
def copy(tmp_path: Path) -> Path:
    path = tmp_path / "small.0123456789abcdef.q4_0.gguf"
    path.write_bytes(b"q4")
    return path


def configure(
    monkeypatch: pytest.MonkeyPatch,
    loader: Loader,
    draft_file: Path,
    copy: Path | None,
    **plugin: object,
) -> DraftModel:
    monkeypatch.setattr(draft_model, "load_draft", loader)
    monkeypatch.setattr(draft_copy, "q4_0_copy", lambda source, cache, threads: copy)
    settings = Settings(
        draft_model=str(draft_file),
        cache_dir=draft_file.parent / "cache",
        plugins={"draft_model": dict(plugin)},
    )
    source = DraftModel()
    source.reame_configure(settings=settings, model=FakeBackend().info)
    return source


def test_the_draft_model_loads_its_q4_0_copy(
    monkeypatch: pytest.MonkeyPatch, draft_file: Path, copy: Path
) -> None:
    loader = Loader()
    configure(monkeypatch, loader, draft_file, copy)
    assert loader.paths == [copy]


def test_weights_file_loads_the_file_as_it_is(
    monkeypatch: pytest.MonkeyPatch, draft_file: Path, tmp_path: Path
) -> None:
    loader = Loader()
    configure(monkeypatch, loader, draft_file, tmp_path / "never.gguf", weights="file")
    assert loader.paths == [draft_file]


def test_without_a_copy_the_file_drafts(monkeypatch: pytest.MonkeyPatch, draft_file: Path) -> None:
    loader = Loader()
    configure(monkeypatch, loader, draft_file, None)
    assert loader.paths == [draft_file]


def test_a_copy_that_does_not_load_is_removed_and_the_file_drafts(
    monkeypatch: pytest.MonkeyPatch, draft_file: Path, copy: Path
) -> None:
    loader = Loader(failing=[copy])
    source = configure(monkeypatch, loader, draft_file, copy)
    assert loader.paths == [copy, draft_file]
    assert not copy.exists()
    assert source.backend is not None


def test_a_refused_draft_model_leaves_no_copy(
    monkeypatch: pytest.MonkeyPatch, draft_file: Path, copy: Path
) -> None:
    pieces = list(FakeVocabulary().pieces())
    pieces[97] = b"x"
    with pytest.raises(ModelLoadError, match="token 97"):
        configure(monkeypatch, Loader(vocab=EditedVocabulary(pieces)), draft_file, copy)
    assert not copy.exists()


@dataclass
class Seq:
    """The fields of a `SequenceView` the draft model reads."""

    key: int
    prompt_tokens: list[int]
    output_tokens: list[int] = field(default_factory=list)


def propose(source: DraftModel, seq: Seq) -> tuple[int, ...]:
    """One draft token for `seq` (so the draft model decodes only to catch up)."""
    proposals = source.reame_propose_drafts([DraftRequest(cast(SequenceView, seq), 1)])
    return proposals[0].tokens if proposals else ()


def drafting_over(backend: FakeBackend) -> DraftModel:
    source = DraftModel()
    source.settings = DraftModelSettings(min_confidence=0.0)
    source.backend = backend  # type: ignore[assignment]
    source._free = list(range(backend.info.n_seq_max - 1, -1, -1))
    return source


SYSTEM = [30 + (7 * i) % 200 for i in range(200)]


def test_a_mirror_copies_the_start_another_holds_instead_of_reading_it_again() -> None:
    backend = FakeBackend(n_seq_max=4)
    source = drafting_over(backend)
    propose(source, Seq(1, [*SYSTEM, 1, 2, 3]))
    before = backend.decoded_tokens
    drafted = propose(source, Seq(2, [*SYSTEM, 4, 5]))
    assert backend.decoded_tokens - before == 2, "only the tokens after the shared start"
    alone = propose(drafting_over(FakeBackend(n_seq_max=4)), Seq(2, [*SYSTEM, 4, 5]))
    assert drafted == alone, "the copied start drafts as the start read again"


def test_a_short_shared_start_is_read_again() -> None:
    backend = FakeBackend(n_seq_max=4)
    source = drafting_over(backend)
    short = SYSTEM[: draft_model.MIN_COPIED - 1]
    propose(source, Seq(1, [*short, 1, 2, 3]))
    before = backend.decoded_tokens
    propose(source, Seq(2, [*short, 4, 5]))
    assert backend.decoded_tokens - before == len(short) + 2
