"""Encoder models: classify, fill-mask, embed, token-classify, rerank and score over one dynamic batcher.

    encoder.py            EncoderModel: text or raw tensors in, rows through the batcher, typed results out
    batching.py           the dynamic batcher: rows from every request and door, one worker call per batch
    pieces.py             a request larger than a batch, through the batcher a few pieces at a time
    length_buckets.py     a batch run in groups of similar length instead of padded to its longest row
    token_aggregation.py  per-token logits -> entities as transformers' pipeline groups them (pure numpy)
    rerank.py             rerank / score: a one-label cross-encoder, or an embedding model's cosine (the pairs and
                          results: server/protocol/pairs.py)
    matryoshka.py         `dimensions` of an embedding request
    activation.py         a classifier's scores: the package's recorded head activation or the request's
                          function_to_apply (softmax | sigmoid | none)
    zero_shot.py          zero-shot classification on an NLI head, as transformers' pipeline answers (the request
                          and result: server/protocol/zero_shot.py)

May import: server.runtime, server.protocol, server.text, server.sessions, server.model, server.admission.
"""
