"""Hostile input, faults, load, security and connection limits against real server processes
(`pytest -m reliability`)."""
