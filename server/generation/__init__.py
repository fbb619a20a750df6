"""Generation engine: continuous batching over one KV-cache ONNX decoder graph (numpy + onnxruntime only).

Semantics the servicers rely on:
- `GenerationParams.validate(...)` raises ValueError("parameters.<field>: ...") for bad values; the
  engine raises ValueError("prompt: ...") / ("parameters.max_new_tokens: ...") when prompt +
  max_new_tokens exceed the manifest's max_length (unless truncate_prompt keeps the prompt's tail).
  An empty prompt starts from the package's bos (else eos) token.
- finish_reason: "length" (max_new_tokens), "eos" (the package's eos, unless ignore_eos), "stop" (a
  stop sequence or a stop_token_ids id; neither's text is in the output; a stop id is the last of `tokens`, a
  stop sequence's tokens are not in it: sequence.py, the token list beside the text),
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

Modules, by job:
- the served models: decoder_model.py (a decoder; KServe text mode), seq2seq_model.py (an encoder-decoder);
- the engine: engine.py (GenerationEngine: assembles the rest behind this API), admission.py (a request's
  sequences queued together or not at all), loop.py (plan -> executor -> outcome, the worker thread),
  streams.py (chunks as streams or whole results), warmup.py (the load-time runs and edges),
  engine_metrics.py (token timings, plans, gauges);
- a request: params.py (parameters, configuration), inputs.py / source.py (prompt or source -> checked ids),
  sequence.py (one request's state and queue), sampling.py (the next token), logits_processors.py (the per-row
  logits seam), outputs.py and detokenize.py (token -> text, chunks), slot_state.py (the running rows' state
  as arrays by slot, and the rule that ends a row),
  results.py (chunks, results, errors);
- the iteration: scheduler.py (the plan, pure Python), executor.py (the plan's calls in the thread),
  strategies.py (decoding strategies behind one interface), beams.py and beam_scores.py (beam search);
- the model's parts: runner.py (the typed seams: Runner, InputProcessor), factory.py (chosen by the manifest), spec.py / seq2seq_spec.py (what the engine reads of a
  package), slot_runner.py / cross_runner.py (onnxruntime calls over the slots), device_cache.py (the cache
  buffers on the session's device), encoder_step.py (an encoder-decoder's sources encoded into its slots).
"""
from .engine import GenerationEngine
from .params import GenerationConfig, GenerationParams
from .results import (EngineStoppedError, GeneratedToken, GenerationResult, OverloadedError, StreamChunk,
                      TokenLogprob, Usage)

__all__ = ["GenerationEngine", "GenerationParams", "GenerationConfig", "StreamChunk", "GenerationResult",
           "GeneratedToken", "TokenLogprob", "Usage", "OverloadedError", "EngineStoppedError"]
