"""The draft-model source's checks that need no model: which draft to load, from which file
(its Q4_0 copy, or the file where there is none or it does not load), and refusing a draft
whose vocabulary differs (the real-model behaviour is in tests/integration)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from reame_core.backend.fake import FakeBackend, FakeVocabulary
from reame_core.builtins import draft_model
from reame_core.builtins.draft_model import DraftModel, check_same_vocabulary, draft_model_name
from reame_core.errors import ModelLoadError
from reame_core.hooktypes import ModelInfo
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
