"""The KServe v2 door: its protocol's wire contract."""
