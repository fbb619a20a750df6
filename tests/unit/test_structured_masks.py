"""A step's grammar masks made together (server/structured/masks.py) and the constrained rows chosen with them
(sampling.choose_rows), checked against a second matcher of each row's constraint fed the same tokens and asked
alone, through another of llguidance's outputs (a byte per token); the end-of-text token must be allowed exactly
when that matcher accepts what came before."""
from __future__ import annotations

import asyncio

import numpy as np
from tokenizers import Tokenizer

from server.generation import GenerationParams
from server.generation.sampling import Sampler, choose_rows
from server.structured import Constraint, constraint_of
from server.structured.matcher import Grammars, constraint_rows
from tests.unit.test_structured import grammars, tokenizer  # noqa: F401  (its fixtures)

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 6},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120}},
          "required": ["name", "age"], "additionalProperties": False}
CONSTRAINTS = [constraint_of("json_schema", SCHEMA, "response_format.json_schema.schema"),
               constraint_of("regex", r"[a-z]{1,4}( [0-9]{1,3})?", "guided_regex"),
               constraint_of("choice", ["hello world", "hi"], "guided_choice")]


class Reference:
    """A second matcher of the same constraint, fed the same tokens, asked alone (llguidance's logit bias: a byte
    per token, 0 where refused)."""

    def __init__(self, grammars: Grammars, constraint: Constraint) -> None:
        self.matcher, self.grammars = grammars.compile(constraint).deep_copy(), grammars

    def allowed(self) -> np.ndarray:
        out = np.frombuffer(self.matcher.compute_logit_bias(), dtype=np.uint8)[:self.grammars.vocab_size] > 0
        assert out[self.grammars.eos_id] == self.matcher.is_accepting()
        return out

    def take(self, token: int) -> None:
        if not self.matcher.is_stopped():
            self.matcher.consume_token(token)


def constrained_sampler(grammars: Grammars, constraint: Constraint, **params: object) -> Sampler:
    row = asyncio.run(constraint_rows(grammars, [constraint]))[0]
    return Sampler(GenerationParams.validate(constraint=constraint, **params), grammars.vocab_size, [1],
                   grammars.eos_id, constraint=row)


def test_masks_of_a_step_made_together_are_each_rows_own(grammars: Grammars) -> None:
    """Rows of three grammars at different points of their answers, masked in one call; each line is the row's
    allowed set (the end-of-text token exactly where its grammar accepts), and each row's `apply` sets the rest to
    -inf in its own scores."""
    rng = np.random.default_rng(3)
    rows = [grammars.row(c) for c in CONSTRAINTS * 2]
    refs = [Reference(grammars, c) for c in CONSTRAINTS * 2]
    for step in range(12):
        allowed = grammars.masks.allowed(rows)
        assert allowed.shape == (len(rows), grammars.vocab_size) and allowed.dtype == bool
        for i, (row, ref) in enumerate(zip(rows, refs)):
            expected = ref.allowed()
            assert np.array_equal(allowed[i], expected), (step, i)
            scores = rng.normal(size=grammars.vocab_size)
            row.apply(scores)
            assert np.array_equal(np.isfinite(scores), expected)
            ids = np.flatnonzero(expected)
            token = int(ids[(step + i) % len(ids)])       # a different allowed token per row and step
            row.advance(token)
            ref.take(token)


def test_greedy_constrained_rows_match_a_masked_argmax_row_by_row(grammars: Grammars) -> None:
    """choose_rows' batched choice of greedy constrained rows, beside sampled constrained rows and unconstrained
    ones: each greedy row's token is the first maximum of its logits among the tokens its grammar allows (the
    logits are coarse, so ties happen, and the model's favourite is often refused); every constrained row's token
    is allowed; every answer ends with the end-of-text token once its grammar accepts."""
    eos = grammars.eos_id
    assert eos is not None
    for trial in range(4):
        kinds = [CONSTRAINTS[(trial + r) % 3] if r != 2 else None for r in range(6)]
        samplers = [Sampler(GenerationParams.validate(temperature=0.0), grammars.vocab_size, [1]) if c is None
                    else constrained_sampler(grammars, c, temperature=0.0 if r % 2 == 0 else 0.8, seed=r)
                    for r, c in enumerate(kinds)]
        refs = [None if c is None else Reference(grammars, c) for c in kinds]
        rng = np.random.default_rng(trial)
        live = [r for r, c in enumerate(kinds) if c is not None] + [2]
        ended: set[int] = set()
        for _ in range(40):
            logits = rng.integers(-3, 4, size=(len(live), grammars.vocab_size)).astype(np.float32)
            expected = [ref.allowed() if (ref := refs[r]) is not None else None for r in live]
            picks = [c.token_id for c in choose_rows([samplers[r] for r in live], logits)]
            for j, (r, pick) in enumerate(zip(live, picks)):
                if expected[j] is None:
                    continue
                assert expected[j][pick], (trial, r, pick)
                if samplers[r].params.temperature == 0:
                    masked = np.where(expected[j], logits[j].astype(np.float64), -np.inf)
                    assert pick == int(np.argmax(masked))
                refs[r].take(pick)
                if pick == eos:
                    ended.add(r)
            live = [r for r, pick in zip(live, picks) if pick != eos or kinds[r] is None]
            if live == [2]:
                break
        assert ended == {r for r, c in enumerate(kinds) if c is not None}


def test_a_matcher_in_error_ends_the_answer(grammars: Grammars, tokenizer: Tokenizer) -> None:
    """A row whose matcher took a token its grammar refuses (a state it cannot leave) gets the end-of-text token
    next, greedy or sampled, beside a healthy row that goes on."""
    eos = grammars.eos_id
    constraint = CONSTRAINTS[1]
    broken = [constrained_sampler(grammars, constraint, temperature=t, seed=1) for t in (0.0, 1.0)]
    healthy = constrained_sampler(grammars, constraint, temperature=0.0)
    for sampler in broken:
        sampler.observe(tokenizer.token_to_id("{"))     # the regex starts with a letter: refused
    logits = np.zeros((3, grammars.vocab_size), dtype=np.float32)
    logits[:, tokenizer.token_to_id("a")] = 5.0
    picks = [c.token_id for c in choose_rows([*broken, healthy], logits)]
    assert picks == [eos, eos, tokenizer.token_to_id("a")]
