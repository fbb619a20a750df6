"""The task API's encoder messages beyond classify / fill-mask / embed (protos/ortserve.proto): Tokenize,
Detokenize, Rerank and ZeroShotClassify requests -> data-plane arguments, results -> protobuf."""
from __future__ import annotations

from protos import ortserve_pb2 as pb
from server.protocol.pairs import Pairs, RerankResult
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


def zero_shot_request(request: pb.ZeroShotClassifyRequest) -> ZeroShotRequest:
    return ZeroShotRequest.build(list(request.texts), list(request.candidate_labels), request.hypothesis_template,
                                 request.multi_label, request.truncate)


def zero_shot_to_proto(result: ZeroShotResult) -> pb.ZeroShotClassifyResponse:
    return pb.ZeroShotClassifyResponse(
        model=result.model, version=result.version, tokens=result.tokens,
        results=[pb.ZeroShotClassification(sequence=r.sequence, labels=r.labels, scores=r.scores)
                 for r in result.results])


__all__ = ["rerank_pairs", "rerank_to_proto", "tokenized_to_proto", "top_n", "zero_shot_request", "zero_shot_to_proto"]
