"""Generation engine: continuous batching over one KV-cache ONNX decoder graph (numpy + onnxruntime only).

Semantics the servicers rely on:
- `GenerationParams.validate(...)` raises ValueError("parameters.<field>: ...") for bad values; the
  engine raises ValueError("prompt: ...") / ("parameters.max_new_tokens: ...") when prompt +
  max_new_tokens exceed the manifest's max_length (unless truncate_prompt keeps the prompt's tail).
  An empty prompt starts from the package's bos (else eos) token.
- finish_reason: "length" (max_new_tokens), "eos" (the package's eos, unless ignore_eos), "stop" (a
  stop sequence or a stop_token_ids id; neither's text is in the output, the token id is in `tokens`),
  "cancelled" (deadline passed while running, or engine stopped).
- Deadlines are time.monotonic() values. Passed before the prefill -> TimeoutError, nothing computed.
- Capacity: a request's sequences (generate_many / stream_many: prompts x n) are admitted together or not at
  all. ValueError when they can never fit (more than max_waiting + max_batch_size sequences, checked before
  tokenizing; more tokens than max_tokens_in_flight); OverloadedError when they do not fit now (the waiting
  queue cannot take the ones beyond the free slots, or the token budget — prompt + max_new_tokens over
  waiting and active requests — would exceed max_tokens_in_flight). One failing, or the caller cancelling,
  cancels the others.
- EngineStoppedError before start() / after stop(); RuntimeError("prefill failed: ..." /
  "decode step failed: ...") when onnxruntime fails (the engine keeps serving other requests).
- Logprobs: log-softmax after repetition penalty and temperature (0 counts as 1), before top-k/top-p.
- Streamed text never splits a UTF-8 character and never shows a stop sequence or a prefix of one
  that may still complete; closing the stream (or cancelling generate()) frees the batch slot.
"""
from .engine import GenerationEngine
from .params import GenerationConfig, GenerationParams
from .results import (EngineStoppedError, GeneratedToken, GenerationResult, OverloadedError, StreamChunk,
                      TokenLogprob, Usage)

__all__ = ["GenerationEngine", "GenerationParams", "GenerationConfig", "StreamChunk", "GenerationResult",
           "GeneratedToken", "TokenLogprob", "Usage", "OverloadedError", "EngineStoppedError"]
