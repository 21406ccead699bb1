"""Palimpsest: every finished generation feeds an on-disk archive that future requests
draft from."""
