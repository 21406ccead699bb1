"""Structure drafts on SmolLM2: its tokenizer merges what the fake's bytes keep apart (a
newline with the next line's indentation, a brace with a quote), and its drafts must never
change what the plain path says.

Verifying drafts is exact only up to near-ties on this build, so greedy outputs with the
source on must equal the plain path up to a first divergence at a near-tie (near_tie.py).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from near_tie import TOP, VERIFY_FLIP_RATE_Q4_1, assert_near_ties, plain_run

from reame_core.backend.llama import LlamaBackend
from reame_core.chat import encode_chat
from reame_core.engine.engine import Engine
from reame_core.plugins import PluginHost
from reame_core.request import GenerationRequest, SamplingParams
from reame_core.settings import Settings
from reame_suggeritore.structure import NAME, Shape, StructureDrafts, TokenKinds

MakeEngine = Callable[..., Engine]

LISTS = (
    "Write a numbered list of 20 countries in Europe.",
    "Give me a bulleted list of 20 vegetables.",
    "List the numbers from 1 to 40 with their names, like 1. one.",
    "Write a numbered list of the 12 months of the year.",
    "List 20 programming languages as a bulleted list.",
    "Make a shopping list with 20 items as bullet points.",
)
MAX_TOKENS = 200


@pytest.mark.parametrize(
    ("text", "draft"),
    [
        ("Fruits:\n\n1. Apple\n2. Banana\n", "3."),
        ("8. Fig\n9. Kiwi\n", "10."),
        ("1. **Apple**: red\n2. **Pear**: green\n", "3. **"),
        # SmolLM2 writes "\n " then " -": the next nested bullet follows the opener "\n "
        ("- fruit\n  - apple\n  - pear\n  - fig", " -"),
        ("| a | b |\n|---|---|\n| 1 | 2 |", "\n| "),
        ('[{"name": "a", "age": 3}, {"', 'name": "'),
        ('[{"name": "a", "age": 3}, {"name": "b",', ' "age": '),
        ('[\n  {\n    "id": 1,\n    "x": 2\n  },\n  {', '\n    "id": '),
    ],
)
def test_drafts_are_the_tokens_smollm2_wrote_for_the_previous_sibling(
    backend: LlamaBackend, text: str, draft: str
) -> None:
    vocab = backend.info.vocab
    tokens = vocab.tokenize(text, add_special=False, parse_special=False)
    if text.endswith("  - fig"):  # stop after the opener, before the item it opens
        tokens = tokens[:-2]
    shape = Shape(TokenKinds(vocab))
    shape.extend(tokens)

    proposed = b"".join(vocab.token_bytes(t) for t in shape.propose(8)).decode()

    assert proposed == draft


def greedy(prompt: list[int]) -> GenerationRequest:
    return GenerationRequest(prompt, SamplingParams(max_tokens=MAX_TOKENS, logprobs=TOP))


def test_list_answers_with_structure_drafts_follow_the_plain_path(
    backend: LlamaBackend, make_engine: MakeEngine, verification_exact: bool
) -> None:
    prompts = [encode_chat(backend.info, [{"role": "user", "content": t}]) for t in LISTS]
    plain_engine = make_engine(backend)
    plain = [plain_run(plain_engine, greedy(p)) for p in prompts]
    plain_engine.stop()
    host = PluginHost(["prompt_lookup", "draft_model"], discover=False)
    host.register(StructureDrafts(), NAME)
    host.hook.reame_configure(settings=Settings(), model=backend.info, hook=host.hook)
    engine = make_engine(backend, speculate="on", plugins=host)
    results = [engine.generate(greedy(p)) for p in prompts]
    engine.stop()

    proposed = sum(r.usage.draft_proposed.get(NAME, 0) for r in results)
    accepted = sum(r.usage.draft_accepted.get(NAME, 0) for r in results)
    assert accepted > 0.8 * proposed > 0, (accepted, proposed)
    drafted = [r.candidates[0].tokens for r in results]
    assert_near_ties(plain, drafted, VERIFY_FLIP_RATE_Q4_1, exact=verification_exact)
