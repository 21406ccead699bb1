"""Model names: aliases, hf: references, local paths, validation and suggestions."""

from __future__ import annotations

from pathlib import Path

import pytest

from reame_core.models.errors import ModelNameError
from reame_core.models.names import (
    EmbeddedModel,
    HubModel,
    LocalModel,
    looks_like_model_name,
    match_quant,
    parse_model_name,
    quant_of,
)
from reame_core.models.registry import CARDS


def test_an_alias_names_its_registry_repo_and_file() -> None:
    ref = parse_model_name("qwen2.5-1.5b")

    assert ref == HubModel(
        "qwen2.5-1.5b",
        "Qwen/Qwen2.5-1.5B-Instruct-GGUF",
        "qwen2.5-1.5b-instruct-q4_k_m.gguf",
        "Q4_K_M",
        CARDS["qwen2.5-1.5b"],
    )


def test_no_name_means_the_embedded_model() -> None:
    ref = parse_model_name(None)

    assert isinstance(ref, EmbeddedModel)
    assert ref.name == "smollm2-135m"


def test_a_hub_reference_may_name_a_file() -> None:
    ref = parse_model_name("hf:bartowski/Qwen2.5-7B-Instruct-GGUF:Qwen2.5-7B-Instruct-Q6_K.gguf")

    assert isinstance(ref, HubModel)
    assert (ref.repo, ref.file, ref.quant) == (
        "bartowski/Qwen2.5-7B-Instruct-GGUF",
        "Qwen2.5-7B-Instruct-Q6_K.gguf",
        None,
    )


def test_a_hub_reference_may_name_a_quantization_in_any_case() -> None:
    ref = parse_model_name("hf:owner/repo:q8_0")

    assert isinstance(ref, HubModel)
    assert (ref.file, ref.quant) == (None, "Q8_0")


def test_a_bare_hub_reference_asks_for_q4_k_m() -> None:
    ref = parse_model_name("hf:owner/repo")

    assert isinstance(ref, HubModel)
    assert ref.quant == "Q4_K_M"


def test_a_gguf_path_is_a_local_model(tmp_path: Path) -> None:
    ref = parse_model_name(str(tmp_path / "my-model.gguf"))

    assert ref == LocalModel("my-model", tmp_path / "my-model.gguf")


@pytest.mark.parametrize(
    "name",
    [
        "hf:../etc",
        "hf:owner/..",
        "hf:owner/repo/extra",
        "hf:.hidden/repo",
        "hf:owner--x/repo",
        "hf:owner/repo:../../escape.gguf",
        "hf:owner/repo:/etc/passwd.gguf",
        "hf:owner/repo:sub/../x.gguf",
        "hf:owner/repo:.hidden.gguf",
        "hf:owner/repo:Q4 K M",
        "hf:owner/repo:a\\b.gguf",
    ],
)
def test_names_that_could_leave_the_cache_directory_are_refused(name: str) -> None:
    with pytest.raises(ModelNameError):
        parse_model_name(name)


def test_an_unknown_name_suggests_the_closest_aliases() -> None:
    with pytest.raises(ModelNameError) as raised:
        parse_model_name("qwen2.5-1.5")

    message = str(raised.value)
    assert "Did you mean qwen2.5-1.5b" in message
    assert "hf:owner/repo" in message


@pytest.mark.parametrize(
    ("word", "is_model"),
    [
        ("qwen2.5-1.5b", True),
        ("QWEN2.5-1.5B", True),
        ("qwen2.5-1.5", True),
        ("tinylama-1.1b", True),
        ("hf:owner/repo", True),
        ("notes.gguf", True),
        ("hello", False),
        ("Summarize:", False),
        ("qwen", False),
    ],
)
def test_a_misspelt_alias_counts_as_a_model_name_not_as_a_prompt(word: str, is_model: bool) -> None:
    assert looks_like_model_name(word) is is_model


@pytest.mark.parametrize(
    "word",
    [
        "qwen2.5-nonexistent-9b",
        "llama3:8b",
        "Mistral-7B-Instruct",
        "9b",
        "135m",
        "./models/mine",
        "/srv/models/mine",
        "~/mine",
        "bartowski/Qwen2.5-3B-Instruct-GGUF",
    ],
)
def test_a_word_shaped_like_a_model_name_counts_as_one_even_if_unknown(word: str) -> None:
    assert looks_like_model_name(word)


@pytest.mark.parametrize(
    "word", ["What is 2+2?", "a question", "2+2", "hi", "and/or", "10km", "Explain:"]
)
def test_a_prompt_word_does_not_count_as_a_model_name(word: str) -> None:
    assert not looks_like_model_name(word)


def test_a_repository_without_hf_prefix_is_told_to_add_it() -> None:
    with pytest.raises(ModelNameError) as raised:
        parse_model_name("bartowski/Qwen2.5-3B-Instruct-GGUF")

    assert "Did you mean hf:bartowski/Qwen2.5-3B-Instruct-GGUF?" in str(raised.value)


@pytest.mark.parametrize(
    ("file", "quant"),
    [
        ("qwen2.5-1.5b-instruct-q4_k_m.gguf", "Q4_K_M"),
        ("Qwen2.5-7B-Instruct-Q4_K_M.gguf", "Q4_K_M"),
        ("SmolLM2-135M-Instruct.Q4_1.gguf", "Q4_1"),
        ("tinyllama-1.1b-chat-v1.0.Q4_K_M.gguf", "Q4_K_M"),
        ("Model-IQ4_XS.gguf", "IQ4_XS"),
        ("model-bf16.gguf", "BF16"),
        ("sub/dir/model-Q8_0.gguf", "Q8_0"),
        ("qwen2.5-7b-instruct-q4_k_m-00001-of-00002.gguf", "Q4_K_M"),
        ("model.gguf", "?"),
    ],
)
def test_the_quantization_is_read_from_the_file_name(file: str, quant: str) -> None:
    assert quant_of(file) == quant


def test_a_quantization_matches_its_own_file_and_not_a_longer_one() -> None:
    files = ["m-Q4_K.gguf", "m-Q4_K_M.gguf", "m-Q4_K_S.gguf", "README.md"]

    assert match_quant(files, "Q4_K_M", "o/r") == "m-Q4_K_M.gguf"
    assert match_quant(files, "Q4_K", "o/r") == "m-Q4_K.gguf"
    assert match_quant(files, "Q8_0", "o/r") is None


def test_a_quantization_split_into_parts_is_refused_with_the_reason() -> None:
    files = ["m-q4_k_m-00001-of-00002.gguf", "m-q4_k_m-00002-of-00002.gguf"]

    with pytest.raises(ModelNameError, match="single-file"):
        match_quant(files, "Q4_K_M", "o/r")


def test_two_files_of_one_quantization_ask_for_a_file_name() -> None:
    with pytest.raises(ModelNameError, match="name one"):
        match_quant(["a/m-Q4_K_M.gguf", "b/m-Q4_K_M.gguf"], "Q4_K_M", "o/r")
