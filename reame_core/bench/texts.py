"""The prompts `reame bench` sends: short, fixed, and shaped like the work Reame is for.

Each tuple is taken in order, as many as a workload's size asks for, so a quick run and a
full run send the same first requests.
"""

from __future__ import annotations

from typing import Any

# Free text that keeps a small model talking (throughput workloads use ignore_eos as well).
STORIES = tuple(
    f"Story number {i}: once upon a time, in a small village by the sea, there lived"
    for i in range(8)
)

# Rewrite tasks: the answer repeats most of the prompt, what prompt lookup drafts from.
REWRITES = (
    "Copy this text exactly, word for word:\n\nDear customer, thank you for your order number "
    "48213. Your package was shipped on Monday and will arrive within three to five business "
    "days. If you have any questions, please reply to this email.",
    "Copy this text exactly, word for word:\n\nInvoice 2291. Date: 12 March 2024. Customer: "
    "Acme Ltd, 14 Harbour Road, Leeds. Items: 3 boxes of paper at 12.50 each, 2 printer "
    "cartridges at 39.99 each. Total due: 117.48. Payment within 30 days.",
    "Copy this text exactly, word for word:\n\nMeeting notes, 4 June. Present: Anna, Bruno, "
    "Chen. Decisions: the release moves to 18 June; Bruno owns the migration script; Chen "
    "reviews the billing changes by Friday. Next meeting: 11 June at 10:00.",
    "Fix the typos in this paragraph:\n\nThe wether was nice, so we walkd to the park and sat "
    "on a bench under the big oak tree untill the sun went down behind the hills.",
    "Copy this text exactly, word for word:\n\nProduct: Trail runner shoe, model TR-40. "
    "Sizes 38 to 46. Colours: black, blue, red. Weight 280 g. Waterproof upper, recycled "
    "rubber sole. Price 89 euros. Ships in 2 days.",
)

# Raw code completion: the start of a Python function, continued by the model (what a
# same-vocabulary draft model guesses well).
CODE = (
    "def merge_sorted(left: list[int], right: list[int]) -> list[int]:\n"
    '    """Merge two sorted lists into one sorted list."""\n',
    "class LRUCache:\n"
    '    """A least-recently-used cache with a fixed capacity."""\n\n'
    "    def __init__(self, capacity: int) -> None:\n",
    "def parse_duration(text: str) -> int:\n"
    '    """Parse durations like "1h30m" or "45s" into a number of seconds."""\n',
    "def binary_search(items: list[int], target: int) -> int:\n"
    '    """Return the index of target in the sorted list items, or -1."""\n',
)

# Sampled at temperature 1.0: words and digits recur, so drafts are proposed, but what
# followed them before rarely follows again.
ADVERSARIAL = (
    "Continue this sequence of random numbers with forty more: 4821 9355 1203 7764 2098 5531",
    "Write forty random four-digit codes separated by spaces, like 1834 2290 7713.",
    "List random letter pairs: ab qz kt ab mv qz lp ab kt zz",
    "Write a wild, surreal story about a city made of glass.",
)

# Requests a nightly batch sends again: the archive's second pass.
REPEATED = tuple(
    f"Write a short paragraph about {topic}."
    for topic in (
        "the history of the bicycle", "how bread is baked", "why leaves change colour",
        "the life of honey bees", "how a lighthouse works", "the water cycle",
        "how trains run on time", "the first printing press",
    )
)  # fmt: skip

# Short-answer questions for best-of-N voting.
QUIZ = (
    "What is 17 + 25? Answer with the number only.",
    "What is the capital of France? Answer with one word.",
    "How many days are in a week? Answer with the number only.",
    "What colour is the sky on a clear day? Answer with one word.",
)

# Documents for JSON-schema extraction.
DOCUMENTS = (
    "Invoice INV-2291 from Rossi Forniture, Bologna, dated 12 March 2024: 3 boxes of paper "
    "and 2 printer cartridges, total 117.48 EUR. Contact: Marta Rossi.",
    "Support ticket 5512 opened 2 May 2024 by Tom Baker at Greenleaf Ltd: the invoice "
    "portal rejects logins since the last update. Priority high.",
    "Booking confirmation for Hotel Aurora, Lisbon: two nights from 14 June 2024 for Ana "
    "Lima, 236.00 EUR paid by card.",
    "Shipping notice from Nordic Parts AB: order 7731 left Gothenburg on 3 April 2024, "
    "value 1,250.00 SEK, contact Erik Holm.",
)
EXTRACTION_SYSTEM = (
    "You extract data from business documents. Answer with one JSON object and nothing else."
)
EXTRACTION_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "document_type": {
            "type": "string",
            "enum": ["invoice", "support_ticket", "booking", "shipping_notice", "other"],
        },
        "organization": {"type": "string", "maxLength": 60},
        "contact_name": {"type": "string", "maxLength": 40},
        "date": {"type": "string", "maxLength": 30},
        "amount": {"type": "number"},
        "currency": {"type": "string", "maxLength": 3},
    },
    "required": ["document_type", "organization", "contact_name", "date", "amount", "currency"],
    "additionalProperties": False,
}


def handbook(rules: int) -> str:
    """A support handbook of `rules` numbered rules (about 30 tokens each): the long system
    prompt that every question of an extraction or support service shares."""
    topics = [
        ("shipping", "orders leave the Bologna workshop within {d} working days"),
        ("returns", "unused items may be returned within {d} days in their original box"),
        ("oil", "lamp oil travels by road only, in bottles of at most {d} litres"),
        ("wicks", "a wick burns for about {d} hours before it needs trimming"),
        ("glass", "chimneys are packed in {d} layers of recycled paper"),
        ("warranty", "brass burners carry a warranty of {d} years against defects"),
        ("repairs", "the workshop repairs old lamps within {d} weeks of receiving them"),
        ("payments", "invoices are payable within {d} days by bank transfer or card"),
    ]
    lines = []
    for number in range(rules):
        topic, rule = topics[number % len(topics)]
        lines.append(
            f"Rule {number + 1} ({topic}): {rule.format(d=2 + (number * 7) % 29)}; say so "
            "plainly and never promise more."
        )
    return (
        "You are the support assistant of Lanterna, a workshop that makes oil lamps. "
        "Follow these rules exactly.\n" + "\n".join(lines)
    )


HANDBOOK_QUESTIONS = (
    "A customer in Vienna wants to return an opened lamp. What do you tell her?",
    "Can we ship lamp oil to Oslo?",
    "Which wick fits the Grande lamp, and how long does it last?",
)
