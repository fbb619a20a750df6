"""The test suite, by level: one folder per level, its marker applied by conftest.py from the folder."""
