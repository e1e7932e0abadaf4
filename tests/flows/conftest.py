"""Fixtures of the flow tests: a real Prefect server on loopback (`server`)."""

from tests.support.prefect_server import server  # noqa: F401 — a fixture, used by name
