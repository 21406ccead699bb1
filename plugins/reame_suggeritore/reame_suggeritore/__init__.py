"""Il Suggeritore: structured output, and grammar as a draft source."""
