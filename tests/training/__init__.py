"""The training stage: models against transformers, tokenizers, data, real `python -m training` runs."""
