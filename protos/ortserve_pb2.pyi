from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class FinishReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FINISH_REASON_UNSPECIFIED: _ClassVar[FinishReason]
    FINISH_REASON_LENGTH: _ClassVar[FinishReason]
    FINISH_REASON_EOS: _ClassVar[FinishReason]
    FINISH_REASON_STOP: _ClassVar[FinishReason]
    FINISH_REASON_CANCELLED: _ClassVar[FinishReason]
FINISH_REASON_UNSPECIFIED: FinishReason
FINISH_REASON_LENGTH: FinishReason
FINISH_REASON_EOS: FinishReason
FINISH_REASON_STOP: FinishReason
FINISH_REASON_CANCELLED: FinishReason

class TextInput(_message.Message):
    __slots__ = ("text", "text_pair")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TEXT_PAIR_FIELD_NUMBER: _ClassVar[int]
    text: str
    text_pair: str
    def __init__(self, text: _Optional[str] = ..., text_pair: _Optional[str] = ...) -> None: ...

class ClassifyRequest(_message.Message):
    __slots__ = ("model", "version", "inputs", "top_k", "truncate", "function_to_apply")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    TRUNCATE_FIELD_NUMBER: _ClassVar[int]
    FUNCTION_TO_APPLY_FIELD_NUMBER: _ClassVar[int]
    model: str
    version: int
    inputs: _containers.RepeatedCompositeFieldContainer[TextInput]
    top_k: int
    truncate: bool
    function_to_apply: str
    def __init__(self, model: _Optional[str] = ..., version: _Optional[int] = ..., inputs: _Optional[_Iterable[_Union[TextInput, _Mapping]]] = ..., top_k: _Optional[int] = ..., truncate: _Optional[bool] = ..., function_to_apply: _Optional[str] = ...) -> None: ...

class LabelScore(_message.Message):
    __slots__ = ("label", "score")
    LABEL_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    label: str
    score: float
    def __init__(self, label: _Optional[str] = ..., score: _Optional[float] = ...) -> None: ...

class Classification(_message.Message):
    __slots__ = ("label", "score", "scores")
    LABEL_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    SCORES_FIELD_NUMBER: _ClassVar[int]
    label: str
    score: float
    scores: _containers.RepeatedCompositeFieldContainer[LabelScore]
    def __init__(self, label: _Optional[str] = ..., score: _Optional[float] = ..., scores: _Optional[_Iterable[_Union[LabelScore, _Mapping]]] = ...) -> None: ...

class ClassifyResponse(_message.Message):
    __slots__ = ("model", "version", "results")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    model: str
    version: int
    results: _containers.RepeatedCompositeFieldContainer[Classification]
    def __init__(self, model: _Optional[str] = ..., version: _Optional[int] = ..., results: _Optional[_Iterable[_Union[Classification, _Mapping]]] = ...) -> None: ...

class EmbedRequest(_message.Message):
    __slots__ = ("model", "version", "texts", "truncate", "dimensions", "prompt_name")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    TEXTS_FIELD_NUMBER: _ClassVar[int]
    TRUNCATE_FIELD_NUMBER: _ClassVar[int]
    DIMENSIONS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_NAME_FIELD_NUMBER: _ClassVar[int]
    model: str
    version: int
    texts: _containers.RepeatedScalarFieldContainer[str]
    truncate: bool
    dimensions: int
    prompt_name: str
    def __init__(self, model: _Optional[str] = ..., version: _Optional[int] = ..., texts: _Optional[_Iterable[str]] = ..., truncate: _Optional[bool] = ..., dimensions: _Optional[int] = ..., prompt_name: _Optional[str] = ...) -> None: ...

class Embedding(_message.Message):
    __slots__ = ("values", "tokens")
    VALUES_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    values: _containers.RepeatedScalarFieldContainer[float]
    tokens: int
    def __init__(self, values: _Optional[_Iterable[float]] = ..., tokens: _Optional[int] = ...) -> None: ...

class EmbedResponse(_message.Message):
    __slots__ = ("model", "version", "embeddings", "dimension", "normalized")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    EMBEDDINGS_FIELD_NUMBER: _ClassVar[int]
    DIMENSION_FIELD_NUMBER: _ClassVar[int]
    NORMALIZED_FIELD_NUMBER: _ClassVar[int]
    model: str
    version: int
    embeddings: _containers.RepeatedCompositeFieldContainer[Embedding]
    dimension: int
    normalized: bool
    def __init__(self, model: _Optional[str] = ..., version: _Optional[int] = ..., embeddings: _Optional[_Iterable[_Union[Embedding, _Mapping]]] = ..., dimension: _Optional[int] = ..., normalized: _Optional[bool] = ...) -> None: ...

class FillMaskRequest(_message.Message):
    __slots__ = ("model", "version", "texts", "top_k", "truncate")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    TEXTS_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    TRUNCATE_FIELD_NUMBER: _ClassVar[int]
    model: str
    version: int
    texts: _containers.RepeatedScalarFieldContainer[str]
    top_k: int
    truncate: bool
    def __init__(self, model: _Optional[str] = ..., version: _Optional[int] = ..., texts: _Optional[_Iterable[str]] = ..., top_k: _Optional[int] = ..., truncate: _Optional[bool] = ...) -> None: ...

class TokenCandidate(_message.Message):
    __slots__ = ("token", "token_id", "score", "sequence")
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    token: str
    token_id: int
    score: float
    sequence: str
    def __init__(self, token: _Optional[str] = ..., token_id: _Optional[int] = ..., score: _Optional[float] = ..., sequence: _Optional[str] = ...) -> None: ...

class MaskPrediction(_message.Message):
    __slots__ = ("position", "candidates")
    POSITION_FIELD_NUMBER: _ClassVar[int]
    CANDIDATES_FIELD_NUMBER: _ClassVar[int]
    position: int
    candidates: _containers.RepeatedCompositeFieldContainer[TokenCandidate]
    def __init__(self, position: _Optional[int] = ..., candidates: _Optional[_Iterable[_Union[TokenCandidate, _Mapping]]] = ...) -> None: ...

class FillMaskResult(_message.Message):
    __slots__ = ("masks",)
    MASKS_FIELD_NUMBER: _ClassVar[int]
    masks: _containers.RepeatedCompositeFieldContainer[MaskPrediction]
    def __init__(self, masks: _Optional[_Iterable[_Union[MaskPrediction, _Mapping]]] = ...) -> None: ...

class FillMaskResponse(_message.Message):
    __slots__ = ("model", "version", "results")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    model: str
    version: int
    results: _containers.RepeatedCompositeFieldContainer[FillMaskResult]
    def __init__(self, model: _Optional[str] = ..., version: _Optional[int] = ..., results: _Optional[_Iterable[_Union[FillMaskResult, _Mapping]]] = ...) -> None: ...

class GenerationParameters(_message.Message):
    __slots__ = ("max_new_tokens", "temperature", "top_k", "top_p", "repetition_penalty", "stop", "stop_token_ids", "seed", "logprobs", "top_logprobs", "truncate_prompt", "ignore_eos", "presence_penalty", "frequency_penalty", "logit_bias", "min_p", "min_tokens", "prompt_logprobs", "num_beams", "length_penalty", "early_stopping", "stream_interval")
    class LogitBiasEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: float
        def __init__(self, key: _Optional[int] = ..., value: _Optional[float] = ...) -> None: ...
    MAX_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    REPETITION_PENALTY_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    STOP_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    TOP_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    TRUNCATE_PROMPT_FIELD_NUMBER: _ClassVar[int]
    IGNORE_EOS_FIELD_NUMBER: _ClassVar[int]
    PRESENCE_PENALTY_FIELD_NUMBER: _ClassVar[int]
    FREQUENCY_PENALTY_FIELD_NUMBER: _ClassVar[int]
    LOGIT_BIAS_FIELD_NUMBER: _ClassVar[int]
    MIN_P_FIELD_NUMBER: _ClassVar[int]
    MIN_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    NUM_BEAMS_FIELD_NUMBER: _ClassVar[int]
    LENGTH_PENALTY_FIELD_NUMBER: _ClassVar[int]
    EARLY_STOPPING_FIELD_NUMBER: _ClassVar[int]
    STREAM_INTERVAL_FIELD_NUMBER: _ClassVar[int]
    max_new_tokens: int
    temperature: float
    top_k: int
    top_p: float
    repetition_penalty: float
    stop: _containers.RepeatedScalarFieldContainer[str]
    stop_token_ids: _containers.RepeatedScalarFieldContainer[int]
    seed: int
    logprobs: bool
    top_logprobs: int
    truncate_prompt: bool
    ignore_eos: bool
    presence_penalty: float
    frequency_penalty: float
    logit_bias: _containers.ScalarMap[int, float]
    min_p: float
    min_tokens: int
    prompt_logprobs: int
    num_beams: int
    length_penalty: float
    early_stopping: str
    stream_interval: int
    def __init__(self, max_new_tokens: _Optional[int] = ..., temperature: _Optional[float] = ..., top_k: _Optional[int] = ..., top_p: _Optional[float] = ..., repetition_penalty: _Optional[float] = ..., stop: _Optional[_Iterable[str]] = ..., stop_token_ids: _Optional[_Iterable[int]] = ..., seed: _Optional[int] = ..., logprobs: _Optional[bool] = ..., top_logprobs: _Optional[int] = ..., truncate_prompt: _Optional[bool] = ..., ignore_eos: _Optional[bool] = ..., presence_penalty: _Optional[float] = ..., frequency_penalty: _Optional[float] = ..., logit_bias: _Optional[_Mapping[int, float]] = ..., min_p: _Optional[float] = ..., min_tokens: _Optional[int] = ..., prompt_logprobs: _Optional[int] = ..., num_beams: _Optional[int] = ..., length_penalty: _Optional[float] = ..., early_stopping: _Optional[str] = ..., stream_interval: _Optional[int] = ...) -> None: ...

class GenerateRequest(_message.Message):
    __slots__ = ("model", "version", "prompt", "parameters", "prompt_ids", "target_language", "source_language", "constraint")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_IDS_FIELD_NUMBER: _ClassVar[int]
    TARGET_LANGUAGE_FIELD_NUMBER: _ClassVar[int]
    SOURCE_LANGUAGE_FIELD_NUMBER: _ClassVar[int]
    CONSTRAINT_FIELD_NUMBER: _ClassVar[int]
    model: str
    version: int
    prompt: str
    parameters: GenerationParameters
    prompt_ids: _containers.RepeatedScalarFieldContainer[int]
    target_language: str
    source_language: str
    constraint: OutputConstraint
    def __init__(self, model: _Optional[str] = ..., version: _Optional[int] = ..., prompt: _Optional[str] = ..., parameters: _Optional[_Union[GenerationParameters, _Mapping]] = ..., prompt_ids: _Optional[_Iterable[int]] = ..., target_language: _Optional[str] = ..., source_language: _Optional[str] = ..., constraint: _Optional[_Union[OutputConstraint, _Mapping]] = ...) -> None: ...

class OutputConstraint(_message.Message):
    __slots__ = ("json_schema", "regex", "choice", "grammar")
    JSON_SCHEMA_FIELD_NUMBER: _ClassVar[int]
    REGEX_FIELD_NUMBER: _ClassVar[int]
    CHOICE_FIELD_NUMBER: _ClassVar[int]
    GRAMMAR_FIELD_NUMBER: _ClassVar[int]
    json_schema: str
    regex: str
    choice: Choices
    grammar: str
    def __init__(self, json_schema: _Optional[str] = ..., regex: _Optional[str] = ..., choice: _Optional[_Union[Choices, _Mapping]] = ..., grammar: _Optional[str] = ...) -> None: ...

class Choices(_message.Message):
    __slots__ = ("options",)
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    options: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, options: _Optional[_Iterable[str]] = ...) -> None: ...

class TokenLogprob(_message.Message):
    __slots__ = ("token_id", "token", "logprob")
    TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    LOGPROB_FIELD_NUMBER: _ClassVar[int]
    token_id: int
    token: str
    logprob: float
    def __init__(self, token_id: _Optional[int] = ..., token: _Optional[str] = ..., logprob: _Optional[float] = ...) -> None: ...

class GeneratedToken(_message.Message):
    __slots__ = ("token_id", "logprob", "top_logprobs", "token")
    TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    LOGPROB_FIELD_NUMBER: _ClassVar[int]
    TOP_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    token_id: int
    logprob: float
    top_logprobs: _containers.RepeatedCompositeFieldContainer[TokenLogprob]
    token: str
    def __init__(self, token_id: _Optional[int] = ..., logprob: _Optional[float] = ..., top_logprobs: _Optional[_Iterable[_Union[TokenLogprob, _Mapping]]] = ..., token: _Optional[str] = ...) -> None: ...

class Usage(_message.Message):
    __slots__ = ("prompt_tokens", "completion_tokens", "cached_prompt_tokens")
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHED_PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    prompt_tokens: int
    completion_tokens: int
    cached_prompt_tokens: int
    def __init__(self, prompt_tokens: _Optional[int] = ..., completion_tokens: _Optional[int] = ..., cached_prompt_tokens: _Optional[int] = ...) -> None: ...

class GenerateResponse(_message.Message):
    __slots__ = ("model", "version", "text", "finish_reason", "usage", "tokens", "time_to_first_token_ms", "total_time_ms", "prompt_tokens")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    TIME_TO_FIRST_TOKEN_MS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    model: str
    version: int
    text: str
    finish_reason: FinishReason
    usage: Usage
    tokens: _containers.RepeatedCompositeFieldContainer[GeneratedToken]
    time_to_first_token_ms: float
    total_time_ms: float
    prompt_tokens: _containers.RepeatedCompositeFieldContainer[GeneratedToken]
    def __init__(self, model: _Optional[str] = ..., version: _Optional[int] = ..., text: _Optional[str] = ..., finish_reason: _Optional[_Union[FinishReason, str]] = ..., usage: _Optional[_Union[Usage, _Mapping]] = ..., tokens: _Optional[_Iterable[_Union[GeneratedToken, _Mapping]]] = ..., time_to_first_token_ms: _Optional[float] = ..., total_time_ms: _Optional[float] = ..., prompt_tokens: _Optional[_Iterable[_Union[GeneratedToken, _Mapping]]] = ...) -> None: ...

class GenerateStreamResponse(_message.Message):
    __slots__ = ("text", "tokens", "final", "finish_reason", "usage", "model", "version", "prompt_tokens")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    FINAL_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    text: str
    tokens: _containers.RepeatedCompositeFieldContainer[GeneratedToken]
    final: bool
    finish_reason: FinishReason
    usage: Usage
    model: str
    version: int
    prompt_tokens: _containers.RepeatedCompositeFieldContainer[GeneratedToken]
    def __init__(self, text: _Optional[str] = ..., tokens: _Optional[_Iterable[_Union[GeneratedToken, _Mapping]]] = ..., final: _Optional[bool] = ..., finish_reason: _Optional[_Union[FinishReason, str]] = ..., usage: _Optional[_Union[Usage, _Mapping]] = ..., model: _Optional[str] = ..., version: _Optional[int] = ..., prompt_tokens: _Optional[_Iterable[_Union[GeneratedToken, _Mapping]]] = ...) -> None: ...

class ListModelsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ModelStatus(_message.Message):
    __slots__ = ("name", "version", "task", "state", "reason", "variant")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    VARIANT_FIELD_NUMBER: _ClassVar[int]
    name: str
    version: int
    task: str
    state: str
    reason: str
    variant: str
    def __init__(self, name: _Optional[str] = ..., version: _Optional[int] = ..., task: _Optional[str] = ..., state: _Optional[str] = ..., reason: _Optional[str] = ..., variant: _Optional[str] = ...) -> None: ...

class ListModelsResponse(_message.Message):
    __slots__ = ("models",)
    MODELS_FIELD_NUMBER: _ClassVar[int]
    models: _containers.RepeatedCompositeFieldContainer[ModelStatus]
    def __init__(self, models: _Optional[_Iterable[_Union[ModelStatus, _Mapping]]] = ...) -> None: ...

class ModelInfoRequest(_message.Message):
    __slots__ = ("model", "version")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    model: str
    version: int
    def __init__(self, model: _Optional[str] = ..., version: _Optional[int] = ...) -> None: ...

class ModelInfoResponse(_message.Message):
    __slots__ = ("status", "labels", "max_length", "mask_token", "variant", "providers", "versions", "max_batch_size", "manifest_json", "cache_bytes_per_slot", "cache_bytes")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    MAX_LENGTH_FIELD_NUMBER: _ClassVar[int]
    MASK_TOKEN_FIELD_NUMBER: _ClassVar[int]
    VARIANT_FIELD_NUMBER: _ClassVar[int]
    PROVIDERS_FIELD_NUMBER: _ClassVar[int]
    VERSIONS_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    MANIFEST_JSON_FIELD_NUMBER: _ClassVar[int]
    CACHE_BYTES_PER_SLOT_FIELD_NUMBER: _ClassVar[int]
    CACHE_BYTES_FIELD_NUMBER: _ClassVar[int]
    status: ModelStatus
    labels: _containers.RepeatedScalarFieldContainer[str]
    max_length: int
    mask_token: str
    variant: str
    providers: _containers.RepeatedScalarFieldContainer[str]
    versions: _containers.RepeatedScalarFieldContainer[int]
    max_batch_size: int
    manifest_json: str
    cache_bytes_per_slot: int
    cache_bytes: int
    def __init__(self, status: _Optional[_Union[ModelStatus, _Mapping]] = ..., labels: _Optional[_Iterable[str]] = ..., max_length: _Optional[int] = ..., mask_token: _Optional[str] = ..., variant: _Optional[str] = ..., providers: _Optional[_Iterable[str]] = ..., versions: _Optional[_Iterable[int]] = ..., max_batch_size: _Optional[int] = ..., manifest_json: _Optional[str] = ..., cache_bytes_per_slot: _Optional[int] = ..., cache_bytes: _Optional[int] = ...) -> None: ...

class TokenizeRequest(_message.Message):
    __slots__ = ("model", "version", "prompt")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    model: str
    version: int
    prompt: str
    def __init__(self, model: _Optional[str] = ..., version: _Optional[int] = ..., prompt: _Optional[str] = ...) -> None: ...

class TokenSpan(_message.Message):
    __slots__ = ("id", "text", "special", "start", "stop")
    ID_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    SPECIAL_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    id: int
    text: str
    special: bool
    start: int
    stop: int
    def __init__(self, id: _Optional[int] = ..., text: _Optional[str] = ..., special: _Optional[bool] = ..., start: _Optional[int] = ..., stop: _Optional[int] = ...) -> None: ...

class TokenizeResponse(_message.Message):
    __slots__ = ("model", "version", "tokens", "max_length")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_LENGTH_FIELD_NUMBER: _ClassVar[int]
    model: str
    version: int
    tokens: _containers.RepeatedCompositeFieldContainer[TokenSpan]
    max_length: int
    def __init__(self, model: _Optional[str] = ..., version: _Optional[int] = ..., tokens: _Optional[_Iterable[_Union[TokenSpan, _Mapping]]] = ..., max_length: _Optional[int] = ...) -> None: ...

class DetokenizeRequest(_message.Message):
    __slots__ = ("model", "version", "tokens")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    model: str
    version: int
    tokens: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, model: _Optional[str] = ..., version: _Optional[int] = ..., tokens: _Optional[_Iterable[int]] = ...) -> None: ...

class DetokenizeResponse(_message.Message):
    __slots__ = ("model", "text")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    model: str
    text: str
    def __init__(self, model: _Optional[str] = ..., text: _Optional[str] = ...) -> None: ...

class RerankRequest(_message.Message):
    __slots__ = ("model", "version", "query", "documents", "top_n", "truncate", "raw_scores", "return_documents")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    QUERY_FIELD_NUMBER: _ClassVar[int]
    DOCUMENTS_FIELD_NUMBER: _ClassVar[int]
    TOP_N_FIELD_NUMBER: _ClassVar[int]
    TRUNCATE_FIELD_NUMBER: _ClassVar[int]
    RAW_SCORES_FIELD_NUMBER: _ClassVar[int]
    RETURN_DOCUMENTS_FIELD_NUMBER: _ClassVar[int]
    model: str
    version: int
    query: str
    documents: _containers.RepeatedScalarFieldContainer[str]
    top_n: int
    truncate: bool
    raw_scores: bool
    return_documents: bool
    def __init__(self, model: _Optional[str] = ..., version: _Optional[int] = ..., query: _Optional[str] = ..., documents: _Optional[_Iterable[str]] = ..., top_n: _Optional[int] = ..., truncate: _Optional[bool] = ..., raw_scores: _Optional[bool] = ..., return_documents: _Optional[bool] = ...) -> None: ...

class RankedDocument(_message.Message):
    __slots__ = ("index", "score", "document")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    DOCUMENT_FIELD_NUMBER: _ClassVar[int]
    index: int
    score: float
    document: str
    def __init__(self, index: _Optional[int] = ..., score: _Optional[float] = ..., document: _Optional[str] = ...) -> None: ...

class RerankResponse(_message.Message):
    __slots__ = ("model", "version", "results", "tokens")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    model: str
    version: int
    results: _containers.RepeatedCompositeFieldContainer[RankedDocument]
    tokens: int
    def __init__(self, model: _Optional[str] = ..., version: _Optional[int] = ..., results: _Optional[_Iterable[_Union[RankedDocument, _Mapping]]] = ..., tokens: _Optional[int] = ...) -> None: ...

class TokenClassifyRequest(_message.Message):
    __slots__ = ("model", "version", "texts", "aggregation_strategy", "ignore_labels", "keep_all_labels", "truncate")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    TEXTS_FIELD_NUMBER: _ClassVar[int]
    AGGREGATION_STRATEGY_FIELD_NUMBER: _ClassVar[int]
    IGNORE_LABELS_FIELD_NUMBER: _ClassVar[int]
    KEEP_ALL_LABELS_FIELD_NUMBER: _ClassVar[int]
    TRUNCATE_FIELD_NUMBER: _ClassVar[int]
    model: str
    version: int
    texts: _containers.RepeatedScalarFieldContainer[str]
    aggregation_strategy: str
    ignore_labels: _containers.RepeatedScalarFieldContainer[str]
    keep_all_labels: bool
    truncate: bool
    def __init__(self, model: _Optional[str] = ..., version: _Optional[int] = ..., texts: _Optional[_Iterable[str]] = ..., aggregation_strategy: _Optional[str] = ..., ignore_labels: _Optional[_Iterable[str]] = ..., keep_all_labels: _Optional[bool] = ..., truncate: _Optional[bool] = ...) -> None: ...

class TokenEntity(_message.Message):
    __slots__ = ("label", "score", "word", "start", "end", "index")
    LABEL_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    WORD_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    label: str
    score: float
    word: str
    start: int
    end: int
    index: int
    def __init__(self, label: _Optional[str] = ..., score: _Optional[float] = ..., word: _Optional[str] = ..., start: _Optional[int] = ..., end: _Optional[int] = ..., index: _Optional[int] = ...) -> None: ...

class TokenClassification(_message.Message):
    __slots__ = ("entities",)
    ENTITIES_FIELD_NUMBER: _ClassVar[int]
    entities: _containers.RepeatedCompositeFieldContainer[TokenEntity]
    def __init__(self, entities: _Optional[_Iterable[_Union[TokenEntity, _Mapping]]] = ...) -> None: ...

class TokenClassifyResponse(_message.Message):
    __slots__ = ("model", "version", "results", "labels")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    model: str
    version: int
    results: _containers.RepeatedCompositeFieldContainer[TokenClassification]
    labels: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, model: _Optional[str] = ..., version: _Optional[int] = ..., results: _Optional[_Iterable[_Union[TokenClassification, _Mapping]]] = ..., labels: _Optional[_Iterable[str]] = ...) -> None: ...

class ZeroShotClassifyRequest(_message.Message):
    __slots__ = ("model", "version", "texts", "candidate_labels", "hypothesis_template", "multi_label", "truncate")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    TEXTS_FIELD_NUMBER: _ClassVar[int]
    CANDIDATE_LABELS_FIELD_NUMBER: _ClassVar[int]
    HYPOTHESIS_TEMPLATE_FIELD_NUMBER: _ClassVar[int]
    MULTI_LABEL_FIELD_NUMBER: _ClassVar[int]
    TRUNCATE_FIELD_NUMBER: _ClassVar[int]
    model: str
    version: int
    texts: _containers.RepeatedScalarFieldContainer[str]
    candidate_labels: _containers.RepeatedScalarFieldContainer[str]
    hypothesis_template: str
    multi_label: bool
    truncate: bool
    def __init__(self, model: _Optional[str] = ..., version: _Optional[int] = ..., texts: _Optional[_Iterable[str]] = ..., candidate_labels: _Optional[_Iterable[str]] = ..., hypothesis_template: _Optional[str] = ..., multi_label: _Optional[bool] = ..., truncate: _Optional[bool] = ...) -> None: ...

class ZeroShotClassification(_message.Message):
    __slots__ = ("sequence", "labels", "scores")
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    SCORES_FIELD_NUMBER: _ClassVar[int]
    sequence: str
    labels: _containers.RepeatedScalarFieldContainer[str]
    scores: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, sequence: _Optional[str] = ..., labels: _Optional[_Iterable[str]] = ..., scores: _Optional[_Iterable[float]] = ...) -> None: ...

class ZeroShotClassifyResponse(_message.Message):
    __slots__ = ("model", "version", "results", "tokens")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    model: str
    version: int
    results: _containers.RepeatedCompositeFieldContainer[ZeroShotClassification]
    tokens: int
    def __init__(self, model: _Optional[str] = ..., version: _Optional[int] = ..., results: _Optional[_Iterable[_Union[ZeroShotClassification, _Mapping]]] = ..., tokens: _Optional[int] = ...) -> None: ...
