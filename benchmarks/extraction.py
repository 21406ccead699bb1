"""A JSON extraction workload: twenty short business documents, one 8-field schema.

The documents are varied on purpose (invoices, support tickets, product listings, shipping
notices, job posts, bookings, reviews, reminders ...), so the schema's values differ from
one to the next while its keys, punctuation and enum spellings repeat: what a structured
output engine can force or draft. `messages` builds the same chat for every server.
"""

from __future__ import annotations

from typing import Any

DOCUMENT_TYPES = (
    "invoice",
    "support_ticket",
    "product_listing",
    "shipping_notice",
    "job_posting",
    "booking",
    "review",
    "other",
)

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "document_type": {"type": "string", "enum": list(DOCUMENT_TYPES)},
        "title": {"type": "string", "maxLength": 80},
        "organization": {"type": "string", "maxLength": 60},
        "contact_name": {"type": "string", "maxLength": 40},
        "date": {"type": "string", "maxLength": 30},
        "amount": {"type": "number"},
        "currency": {"type": "string", "maxLength": 3},
        "keywords": {
            "type": "array",
            "items": {"type": "string", "maxLength": 24},
            "minItems": 1,
            "maxItems": 4,
        },
    },
    "required": [
        "document_type",
        "title",
        "organization",
        "contact_name",
        "date",
        "amount",
        "currency",
        "keywords",
    ],
    "additionalProperties": False,
}

SYSTEM = "You extract data from business documents. Answer with one JSON object and nothing else."
INSTRUCTIONS = (
    "Extract these fields from the document below: document_type (one of "
    + ", ".join(DOCUMENT_TYPES)
    + "), title (a short title for the document), organization (the company or shop), "
    "contact_name (the person named, or an empty string), date (as written), amount (the "
    "main sum of money as a number, 0 if there is none), currency (a three-letter code such "
    "as EUR, or an empty string) and keywords (one to four lowercase words)."
)

DOCUMENTS = (
    "INVOICE No. 2024-0387\nDate: 14 March 2024\nFrom: Officina Verdi Srl, Via Roma 12, "
    "Bologna\nTo: Lanterna Lamps, attn. Giulia Ferri\n3 x brass burner at 18.50 EUR\n"
    "10 x cotton wick (medium) at 1.20 EUR\nTotal due: 67.50 EUR within 30 days.",
    "Ticket #55120 - opened by Mark Ellison on 2 May 2024\nProduct: CloudBox router X2\n"
    "Since the firmware update yesterday the router reboots every hour and the Wi-Fi drops. "
    "I already tried a factory reset. Please help, our office depends on it.",
    "FOR SALE: Trail runner shoe TR-40 by Northpeak. Sizes 38-46, black, blue or red, "
    "280 g, waterproof upper, recycled rubber sole. Price: 89 EUR. Ships in 2 days.",
    "Your parcel is on its way! Order 77-1193 from Bookhaven was handed to FastPost on "
    "5 June 2024. Recipient: Sara Lindqvist, Storgatan 4, Uppsala. Expected delivery: "
    "7 June. Shipping paid: 4.90 EUR.",
    "We're hiring: Junior Data Analyst at Meridian Analytics (Lisbon, hybrid). You know SQL "
    "and Python and like clean dashboards. Salary from 32,000 EUR a year. Apply by 30 April "
    "2024 to the hiring manager, Tomas Pereira.",
    "Booking confirmation - Hotel Belvedere, Lake Como\nGuest: Anna Keller\nCheck-in: "
    "12 August 2024, check-out: 15 August 2024, double room with lake view, breakfast "
    "included. Total: 540.00 EUR, paid by card.",
    "Review of Trattoria da Nino (posted 3 February 2024 by Luca M.): the carbonara was the "
    "best I've had in years and the staff were lovely, but we waited 40 minutes for a table. "
    "Dinner for two came to 62 EUR. Four stars.",
    "Reminder: the annual general meeting of the Greenway Cycling Club takes place on "
    "21 November 2024 at 19:00 in the town library. Membership fee for next year: 35 GBP. "
    "Questions to the secretary, Helen Moore.",
    "INVOICE 88213 - BrightSparks Electrical Ltd\nCustomer: Peter Walsh, 9 Mill Lane, Cork\n"
    "Date: 8 January 2024\nReplacement of fuse board and 6 sockets, labour 5 hours.\n"
    "Amount payable: 1,240.00 EUR (VAT included).",
    "Support request from Yuki Tanaka, 19 September 2024: I was charged twice for my "
    "PixelPro annual subscription (2 x 59.99 USD). Please refund one of the payments to my "
    "card ending 4471.",
    "Handmade ceramic mug, 350 ml, glazed in ocean blue, dishwasher safe. Made in Porto by "
    "Barro & Fogo studio. 24 EUR each or 4 for 85 EUR. Limited batch, order before 1 "
    "December 2024.",
    "Shipment notice: pallet of 40 cartons (office chairs, model ErgoSeat 3) left the "
    "Rotterdam warehouse of Nordline Logistics on 11 October 2024, truck NL-48-TX. "
    "Consignee: Dieter Braun, Hamburg. Freight charge 780 EUR.",
    "Position: Senior Backend Engineer (Go, PostgreSQL) at Fernwood Health, remote within "
    "the EU. Salary 70,000 to 85,000 EUR. Contact: Priya Nair, posted 4 March 2024.",
    "Table for 6 reserved at Sakura Sushi Bar on Friday 26 July 2024 at 20:30 under the "
    "name Daniel Okafor. A deposit of 60 GBP has been taken and will be deducted from the "
    "bill.",
    "The Lumen desk lamp by Studio Nord arrived quickly and looks great, but the dimmer "
    "buzzes at low brightness. Paid 119 EUR on 14 May 2024. Three stars. - Claire Dubois",
    "Ticket 7741 (priority high), reported 30 January 2024 by Omar Haddad at Atlas Freight: "
    "the invoicing portal shows error 502 when we export monthly statements to PDF. No "
    "workaround found.",
    "Notice of rent increase: from 1 September 2024 the monthly rent for flat 3B, 22 Elm "
    "Street, rises to 1,150 GBP. Issued by Castle Lettings on behalf of the landlord, "
    "Richard Hale.",
    "INVOICE - Kaffeerösterei Berger GmbH, Graz\nInvoice date: 27 June 2024\nCustomer: Café "
    "Mondschein, attn. Eva Gruber\n20 kg house blend espresso beans at 21.00 EUR/kg\nTotal: "
    "420.00 EUR, due 27 July 2024.",
    "Refurbished laptop ThinkBook 14 G2, Intel i5, 16 GB RAM, 512 GB SSD, 12-month "
    "warranty from TechRevive. Was 649 EUR, now 479 EUR. Offer valid until 15 September "
    "2024.",
    "Delivery failed: FastPost tried to deliver parcel 3390-221 to Jonas Weber on 3 April "
    "2024 but nobody was home. Pick it up at the Lindenstrasse post office within 7 days; "
    "redelivery costs 3.50 EUR.",
)


def messages(document: str) -> list[dict[str, str]]:
    """The chat every server gets for one document."""
    return [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": f"{INSTRUCTIONS}\n\nDocument:\n{document}"},
    ]


def response_format() -> dict[str, Any]:
    """OpenAI's structured output field, as both Reame and llama-server accept it."""
    return {
        "type": "json_schema",
        "json_schema": {"name": "document", "schema": SCHEMA, "strict": True},
    }
