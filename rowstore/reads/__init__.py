"""Reads: query predicates, read plans, and reading sealed segments without a node."""
