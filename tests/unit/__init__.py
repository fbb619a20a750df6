"""Fast in-process tests: no subprocess, no server process, no network socket (`pytest -m unit`)."""
