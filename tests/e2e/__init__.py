"""Real server processes on localhost, by front door (`pytest -m e2e`)."""
