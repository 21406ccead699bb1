"""Reame's own features, written as plugins against `reame_core.hookspecs`."""
