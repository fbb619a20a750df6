"""The export stage: graphs against PyTorch, the parity gate, variants, refused publication."""
