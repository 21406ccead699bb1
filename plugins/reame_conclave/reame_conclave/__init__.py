"""The Conclave: best-of-N in one interleaved batch, majority vote, early stop."""
