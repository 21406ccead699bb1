"""Writes reame_core/bench/data/trace.jsonl, the day of requests that `reame bench`'s
`trace` workload and benchmarks/trace.py replay against a server (it ships inside the
package, so an installed `reame bench` has it).

One office's traffic to one model, in four kinds:
  extract  clients of a back office sending documents for extraction into one JSON schema
           (benchmarks/extraction.py's), all behind one long shared system prompt, with
           OpenAI's ``response_format: {"type": "json_schema", ...}``;
  chat     conversations of several turns; each turn arrives a think time after the
           previous answer, and its messages carry the whole conversation so far;
  rewrite  edits of a supplied passage (prose or code): the answer copies most of it;
  rerun    the nightly batch: earlier extract and rewrite requests sent again, byte for byte,
           once the day is over (its last answer received).
Arrivals are a seeded Poisson process at one request per second (nominal: the replay
stretches every time by its pace to fit the host), in the day and again in the night.
Seeded, so rerunning writes the same file.

Each line is one request: ``id``, ``kind``, ``client``, ``at`` (seconds from the start of
the day, or for a rerun of the night), and ``body`` (the whole request, sent as is). A chat
turn's body has no messages: its ``session``, ``turn``, ``system`` (the conversation's
system prompt), ``user`` (the new message) and ``think`` (seconds after the previous answer)
say how to build them. ``rerun_of`` names the request a rerun repeats.

    .venv/bin/python benchmarks/data/make_trace.py
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from extraction import DOCUMENTS, INSTRUCTIONS, SYSTEM, response_format

TRACE = Path(__file__).resolve().parents[2] / "reame_core" / "bench" / "data" / "trace.jsonl"
SEED = 2612
EXTRACT_CLIENTS = ("billing", "helpdesk", "logistics")
EXTRACTS_PER_CLIENT = 5
RERUNS = {"extract": 6, "rewrite": 2}
MEAN_GAP = 1.0  # seconds between arrivals, nominal
MEAN_THINK = 2.0  # seconds a chat user takes to answer, nominal
EXTRACT_MAX_TOKENS = 400  # room for every field at its longest; answers stop far sooner
CHAT_MAX_TOKENS = 96

# What every extraction client sends first: the office's rules, long and never changing.
EXTRACTION_POLICY = (
    SYSTEM + "\n\nYou work for the back office of Castello Trading, a wholesaler of kitchen and "
    "household goods with warehouses in Bologna, Graz and Rotterdam. Every day the office "
    "receives invoices from suppliers, support tickets from shops, product listings from "
    "partners, shipping notices from carriers, job postings, bookings for staff travel, "
    "customer reviews and assorted notices. Each one is filed with the fields below, and "
    "the filing system rejects anything that is not a single JSON object with exactly those "
    "fields.\n\nRules for the fields:\n"
    "- document_type: pick the closest type; a rent notice, a meeting reminder or anything "
    "else that fits no other type is 'other'. A refund request is a support_ticket. A "
    "reservation of a table, a room or a seat is a booking.\n"
    "- title: a short title in plain words, at most eight words, no quotes, no dates.\n"
    "- organization: the company, shop, club or studio the document comes from or is about; "
    "leave out legal forms only when they are not written.\n"
    "- contact_name: the one person named as sender, customer, guest, recipient or contact, "
    "first name and family name as written; an empty string when nobody is named.\n"
    "- date: the first date in the document, exactly as written, without a weekday.\n"
    "- amount: the main sum of money as a plain number with a dot for decimals and no "
    "thousands separator (1,240.00 becomes 1240.0); the total when there is one, otherwise "
    "the first price; 0 when there is no money in the document.\n"
    "- currency: the ISO code of that amount (EUR, GBP, USD, SEK ...); an empty string when "
    "the amount is 0.\n"
    "- keywords: one to four lowercase single words that a clerk would search for, most "
    "specific first, never the document type itself.\n\n"
    "Never invent values that are not in the document, never add fields, never explain. If "
    "a document is in another language, still answer in English. " + INSTRUCTIONS
)

CHATS = (
    (
        "I want to start baking my own bread at home. What do I need to buy first?",
        "Which flour should I use for a simple white loaf?",
        "How long should the dough rise, and how do I know it is ready?",
    ),
    (
        "Our team keeps missing deadlines. How can I run a better weekly planning meeting?",
        "What should the agenda look like for a thirty-minute meeting?",
        "How do I handle people who talk too long in that meeting?",
    ),
    (
        "I have a small garden that gets sun only in the morning. What vegetables can grow there?",
        "When should I plant lettuce and spinach?",
        "How often do they need water in summer?",
    ),
)
CHAT_SYSTEM = "You are a friendly, practical assistant. Answer in a few short sentences."

REWRITES = (
    (
        "Fix the spelling mistakes in this email. Change nothing else and answer with the "
        "corrected email only.",
        "Dear Mr Walsh,\n\nthank you for your mesage of 8 January. We have recieved the "
        "replacment fuse board and our electrician will come on Thursday morning betwen 9 and "
        "11 to install it, together with the six new sockets. Please make sure someone is at "
        "home to let him in. The invoice will be sent seperately once the work is finished.\n\n"
        "Kind regards,\nBrightSparks Electrical",
    ),
    (
        "Rewrite this notice so that it speaks of 'members' instead of 'customers'. Keep "
        "every other word and answer with the notice only.",
        "Notice to customers: from 1 March the shop opens at 8:00 instead of 9:00 on weekdays. "
        "Customers who ordered before 20 February can collect their orders from the side "
        "door. Customers with a loyalty card keep their discount of ten percent on all "
        "kitchen goods. We thank our customers for their patience during the renovation.",
    ),
    (
        "Change the date of the meeting in these minutes from 11 June to 18 June everywhere. "
        "Keep everything else exactly as it is and answer with the minutes only.",
        "Minutes, planning meeting, 4 June.\nPresent: Anna, Bruno, Chen, Dana.\n1. The release "
        "moves to 11 June; Bruno prepares the migration script before 11 June.\n2. Chen "
        "reviews the billing changes and reports on 11 June.\n3. Dana books the room for the "
        "next meeting on 11 June at 10:00.\nNext meeting: 11 June at 10:00, room 204.",
    ),
    (
        "Rename the function `calc` to `invoice_total` and its parameter `xs` to `lines`. "
        "Change nothing else and answer with the code only.",
        "def calc(xs, vat_rate=0.22):\n"
        "    subtotal = 0.0\n"
        "    for line in xs:\n"
        "        subtotal += line.quantity * line.unit_price\n"
        "    discount = subtotal * 0.05 if subtotal > 1000 else 0.0\n"
        "    taxable = subtotal - discount\n"
        "    return round(taxable * (1 + vat_rate), 2)\n\n\n"
        "def report(orders):\n"
        "    for order in orders:\n"
        "        print(order.number, calc(order.lines))\n",
    ),
    (
        "Add type hints to this function (the path is a str, the result a dict of str to "
        "int). Change nothing else and answer with the code only.",
        "def count_words(path):\n"
        "    counts = {}\n"
        "    with open(path, encoding='utf-8') as handle:\n"
        "        for line in handle:\n"
        "            for word in line.lower().split():\n"
        "                word = word.strip('.,;:!?\"()')\n"
        "                if word:\n"
        "                    counts[word] = counts.get(word, 0) + 1\n"
        "    return counts\n",
    ),
    (
        "Replace every print call in this code with a call to `log.info`, keeping the "
        "arguments. Change nothing else and answer with the code only.",
        "def ship(parcels, carrier):\n"
        "    print('shipping', len(parcels), 'parcels with', carrier.name)\n"
        "    for parcel in parcels:\n"
        "        if parcel.weight > carrier.max_weight:\n"
        "            print('too heavy:', parcel.code)\n"
        "            continue\n"
        "        label = carrier.label(parcel)\n"
        "        print('label', label.number, 'for', parcel.code)\n"
        "    print('done')\n",
    ),
)


def extract_body(document: str) -> dict[str, Any]:
    return {
        "messages": [
            {"role": "system", "content": EXTRACTION_POLICY},
            {"role": "user", "content": f"Document:\n{document}"},
        ],
        "temperature": 0,
        "max_tokens": EXTRACT_MAX_TOKENS,
        "response_format": response_format(),
    }


def rewrite_body(instruction: str, passage: str) -> dict[str, Any]:
    # Room for the whole passage again, with some to spare (a passage of n characters is
    # well under n / 2 tokens).
    return {
        "messages": [{"role": "user", "content": f"{instruction}\n\n{passage}"}],
        "temperature": 0,
        "max_tokens": len(passage) // 2,
    }


def day(rng: random.Random) -> list[dict[str, Any]]:
    """The day's opening requests in arrival order: extractions, rewrites and the first
    turn of each chat (later turns follow their answers, so they carry think times)."""
    documents = rng.sample(DOCUMENTS, len(EXTRACT_CLIENTS) * EXTRACTS_PER_CLIENT)
    opening: list[dict[str, Any]] = [
        {"kind": "extract", "client": client, "body": extract_body(document)}
        for i, client in enumerate(EXTRACT_CLIENTS)
        for document in documents[i * EXTRACTS_PER_CLIENT : (i + 1) * EXTRACTS_PER_CLIENT]
    ]
    opening += [
        {"kind": "rewrite", "client": "editor", "body": rewrite_body(instruction, passage)}
        for instruction, passage in REWRITES
    ]
    opening += [{"kind": "chat", "session": f"chat-{i}", "turn": 0} for i in range(len(CHATS))]
    rng.shuffle(opening)
    return opening


def chat_turn(session: str, turn: int, think: float) -> dict[str, Any]:
    return {
        "kind": "chat",
        "client": session,
        "session": session,
        "turn": turn,
        "system": CHAT_SYSTEM,
        "user": CHATS[int(session.split("-")[1])][turn],
        "think": round(think, 3),
        "body": {"temperature": 0, "max_tokens": CHAT_MAX_TOKENS},
    }


def make_trace(seed: int = SEED) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    trace: list[dict[str, Any]] = []
    clock = 0.0
    for request in day(rng):
        clock += rng.expovariate(1 / MEAN_GAP)
        if request["kind"] == "chat":
            session = request["session"]
            trace.append({**chat_turn(session, 0, 0.0), "at": round(clock, 3)})
            trace += [
                {**chat_turn(session, turn, rng.expovariate(1 / MEAN_THINK)), "at": None}
                for turn in range(1, len(CHATS[0]))
            ]
        else:
            trace.append({**request, "at": round(clock, 3)})
    for number, request in enumerate(trace):
        request["id"] = f"r{number:02d}"
    night = [
        request
        for kind, count in RERUNS.items()
        for request in rng.sample([r for r in trace if r["kind"] == kind], count)
    ]
    rng.shuffle(night)
    clock = 0.0
    for number, request in enumerate(night, start=len(trace)):
        clock += rng.expovariate(1 / MEAN_GAP)
        rerun = {"kind": "rerun", "client": "nightly", "rerun_of": request["id"]}
        trace.append({**request, **rerun, "id": f"r{number:02d}", "at": round(clock, 3)})
    return [{"id": r.pop("id"), **r} for r in trace]  # the id first, for whoever reads it


def main() -> None:
    trace = make_trace()
    TRACE.write_text("".join(json.dumps(row) + "\n" for row in trace))
    print(f"{len(trace)} requests written to {TRACE}")


if __name__ == "__main__":
    main()
