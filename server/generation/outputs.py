"""Output processing: a chosen token becomes the request's next chunk — its text (never a partial character,
never a stop sequence or the part of one that may still complete), the end of the sequence when the token or
the text says so, and the chunk on the request's queue. Runs on the event loop, after the step."""
from __future__ import annotations

from tokenizers import Tokenizer

from .results import FINISH_EOS, FINISH_LENGTH, FINISH_STOP, StreamChunk
from .sampling import Choice
from .sequence import Sequence, to_generated_token


def emit_token(seq: Sequence, choice: Choice, tokenizer: Tokenizer, eos_id: int | None) -> None:
    """Append the (already sampled and observed) token to the sequence and send what it produced."""
    token = choice.token_id
    seq.generated.append(token)
    generated = to_generated_token(choice, tokenizer)
    params = seq.params
    # eos and stop-token ids end the sequence; their text is not part of the output.
    if token == eos_id and not params.ignore_eos:
        seq.finish(FINISH_EOS, tokens=[generated])
        return
    if token in params.stop_token_ids:
        seq.finish(FINISH_STOP, tokens=[generated])
        return
    text = seq.stopper.feed(seq.detokenizer.push(token))
    if seq.stopper.stopped:
        seq.finish(FINISH_STOP, text, [generated])
    elif len(seq.generated) >= params.max_new_tokens:
        seq.finish(FINISH_LENGTH, text, [generated])
    else:
        seq.send(StreamChunk(text=text, tokens=[generated], prompt_tokens=seq.take_prompt_tokens()))
