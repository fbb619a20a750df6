"""Output processing: a chosen token becomes the request's next chunk — its text (never a partial character,
never a stop sequence or the part of one that may still complete) with the tokens whose text it releases
(sequence.py: the token list beside the text), the end of the sequence when the token (stops.py) or the text says
so, and the chunk on the request's queue. Runs on the event loop, after the step."""
from __future__ import annotations

from tokenizers import Tokenizer

from .results import FINISH_LENGTH, FINISH_STOP, StreamChunk
from .sampling import Choice
from .sequence import Sequence, to_generated_token
from .stops import StopRules


def emit_token(seq: Sequence, choice: Choice, tokenizer: Tokenizer, rules: StopRules) -> None:
    """Append the (already sampled and observed) token to the sequence and send what it produced."""
    token = choice.token_id
    seq.generated.append(token)
    generated = to_generated_token(choice, tokenizer)
    position = seq.state.computed if seq.state is not None else len(seq.prompt_ids) + len(seq.generated) - 1
    reason = rules.reason(seq, token, len(seq.generated), position)
    # eos and stop-token ids end the sequence; their text is not part of the output.
    if reason is not None and reason != FINISH_LENGTH:
        seq.finish(reason, tokens=[generated])
        return
    text = seq.add_text(generated, seq.detokenizer.push(token))
    if seq.stopper.stopped:
        seq.finish(FINISH_STOP, text)
    elif reason is not None:
        seq.finish(reason, text)
    else:
        released = seq.take_released()
        if text or released:     # (nothing when a stop string may still take this token's text)
            seq.send(StreamChunk(text=text, tokens=released, prompt_tokens=seq.take_prompt_tokens()))
