"""The task API's encoder messages beyond classify / fill-mask / embed (protos/ortserve.proto): Tokenize,
Detokenize, Rerank, TokenClassify and ZeroShotClassify requests -> data-plane arguments, results -> protobuf.

A token-classify answer of many entities (up to one per token of 1,024 texts) takes seconds of Python to build:
`token_classify_encoded` builds and encodes it in a worker thread and hands grpc the bytes (server/grpc/decoding.py
lets a handler answer bytes already encoded)."""
from __future__ import annotations

from protos import ortserve_pb2 as pb
from server.protocol.pairs import Pairs, RerankResult
from server.protocol.types import TokenClassifyResult
from server.protocol.zero_shot import ZeroShotRequest, ZeroShotResult
from server.text.spans import Tokenized


def tokenized_to_proto(result: Tokenized) -> pb.TokenizeResponse:
    return pb.TokenizeResponse(model=result.model, version=result.version, max_length=result.max_length,
                               tokens=[pb.TokenSpan(id=t.id, text=t.text, special=t.special, start=t.start, stop=t.stop)
                                       for t in result.tokens])


def rerank_pairs(request: pb.RerankRequest) -> Pairs:
    return Pairs.broadcast("query", request.query, "documents", list(request.documents))


def top_n(request: pb.RerankRequest) -> int | None:
    return request.top_n if request.HasField("top_n") else None


def rerank_to_proto(request: pb.RerankRequest, result: RerankResult) -> pb.RerankResponse:
    documents = request.documents
    return pb.RerankResponse(
        model=result.model, version=result.version, tokens=result.tokens,
        results=[pb.RankedDocument(index=r.index, score=r.score,
                                   document=documents[r.index] if request.return_documents else "")
                 for r in result.results])


def token_classify_to_proto(result: TokenClassifyResult) -> pb.TokenClassifyResponse:
    response = pb.TokenClassifyResponse(model=result.model, version=result.version, labels=result.labels)
    for entities in result.results:
        response.results.add().entities.extend(
            pb.TokenEntity(label=e.label, score=e.score, word=e.word, start=e.start, end=e.end,
                           index=-1 if e.index is None else e.index) for e in entities)
    return response


def token_classify_encoded(result: TokenClassifyResult) -> bytes:
    """The answer's wire bytes, a text at a time (run in a worker thread). Serialized messages concatenated parse
    as one message whose repeated fields are joined in order, so each text's entities are encoded on their own:
    no call holds the GIL for the whole answer (the event loop gets it between texts), and each text's entities
    are released here as soon as they are encoded, not later on the loop. Empties result.results."""
    rows = result.results
    parts = [pb.TokenClassifyResponse(model=result.model, version=result.version,
                                      labels=result.labels).SerializeToString()]
    for i, entities in enumerate(rows):
        one = pb.TokenClassifyResponse()
        one.results.add().entities.extend(
            pb.TokenEntity(label=e.label, score=e.score, word=e.word, start=e.start, end=e.end,
                           index=-1 if e.index is None else e.index) for e in entities)
        parts.append(one.SerializeToString())
        rows[i] = []
    return b"".join(parts)


def zero_shot_request(request: pb.ZeroShotClassifyRequest) -> ZeroShotRequest:
    return ZeroShotRequest.build(list(request.texts), list(request.candidate_labels), request.hypothesis_template,
                                 request.multi_label, request.truncate)


def zero_shot_to_proto(result: ZeroShotResult) -> pb.ZeroShotClassifyResponse:
    return pb.ZeroShotClassifyResponse(
        model=result.model, version=result.version, tokens=result.tokens,
        results=[pb.ZeroShotClassification(sequence=r.sequence, labels=r.labels, scores=r.scores)
                 for r in result.results])


__all__ = ["rerank_pairs", "rerank_to_proto", "tokenized_to_proto", "top_n", "zero_shot_request", "zero_shot_to_proto"]
