"""Helpers shared by the tests: reference implementations, tables, stored pipeline data, model fixtures."""
