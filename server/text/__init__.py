"""Text <-> token ids with a package's own tokenizer.json (HF `tokenizers`), for every model kind.

    tokenizer.py  loading a tokenizer that neither pads nor truncates; an encoder's TextEncoder; padding a batch
    spans.py      Tokenize / Detokenize answers: token spans with offsets, special-token marks, bounds on ids
    chat_template.py  chat messages -> one prompt with a package's chat template (Jinja's sandbox, HF variables)

May import: server.protocol only.
"""
