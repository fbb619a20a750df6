"""The export-and-deploy pipeline end to end (`python -m pipeline` into a server) and deploy/'s artefacts."""
