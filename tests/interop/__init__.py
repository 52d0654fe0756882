"""Interop tests: clients in other languages (Go) against the real daemons."""
