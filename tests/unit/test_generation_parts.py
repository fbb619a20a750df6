"""Unit tests of the generation engine's parts: parameter validation, sampling, detokenization, KV cache."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, pre_tokenizers

from server.generation import GenerationConfig, GenerationParams
from server.generation.detokenize import IncrementalDetokenizer, StopMatcher
from server.generation.sequence import Sequence
from server.generation.logits_processors import apply_repetition_penalty
from server.generation.sampling import Sampler, choose_rows, nucleus, log_softmax, top_n

# ---------------------------------------------------------------- parameters


def test_params_defaults_follow_the_proto() -> None:
    p = GenerationParams.validate()
    assert (p.max_new_tokens, p.temperature, p.top_k, p.top_p, p.repetition_penalty) == (32, 0.0, 0, 1.0, 1.0)
    assert p.stop == () and p.seed is None and not p.wants_logprobs


@pytest.mark.parametrize("kwargs, field", [
    ({"top_p": 0.0}, "parameters.top_p"),
    ({"top_p": 1.5}, "parameters.top_p"),
    ({"top_p": float("nan")}, "parameters.top_p"),
    ({"temperature": -0.1}, "parameters.temperature"),
    ({"temperature": float("inf")}, "parameters.temperature"),
    ({"temperature": "hot"}, "parameters.temperature"),
    ({"max_new_tokens": 0}, "parameters.max_new_tokens"),
    ({"max_new_tokens": True}, "parameters.max_new_tokens"),
    ({"max_new_tokens": 2.5}, "parameters.max_new_tokens"),
    ({"top_k": -1}, "parameters.top_k"),
    ({"repetition_penalty": 0.0}, "parameters.repetition_penalty"),
    ({"stop": "x"}, "parameters.stop"),
    ({"stop": ["ok", ""]}, "parameters.stop[1]"),
    ({"stop_token_ids": [3, -1]}, "parameters.stop_token_ids[1]"),
    ({"seed": -1}, "parameters.seed"),
    ({"seed": 2 ** 64}, "parameters.seed"),
    ({"top_logprobs": 21}, "parameters.top_logprobs"),
    ({"prompt_logprobs": 21}, "parameters.prompt_logprobs"),
    ({"prompt_logprobs": -1}, "parameters.prompt_logprobs"),
    ({"prompt_logprobs": True}, "parameters.prompt_logprobs"),
    ({"logprobs": 1}, "parameters.logprobs"),
    ({"presence_penalty": 2.5}, "parameters.presence_penalty"),
    ({"min_p": 1.5}, "parameters.min_p"),
    ({"min_tokens": -1}, "parameters.min_tokens"),
    ({"stream_interval": 0}, "parameters.stream_interval"),
    ({"stream_interval": 2.0}, "parameters.stream_interval"),
    ({"min_tokens": 5, "max_new_tokens": 4}, "parameters.min_tokens"),
    ({"frequency_penalty": -2.01}, "parameters.frequency_penalty"),
    ({"frequency_penalty": float("nan")}, "parameters.frequency_penalty"),
    ({"logit_bias": [(1, 2.0)]}, "parameters.logit_bias"),
    ({"logit_bias": {-3: 1.0}}, "parameters.logit_bias"),
    ({"logit_bias": {7: 100.5}}, "parameters.logit_bias[7]"),
    ({"logit_bias": {7: "up"}}, "parameters.logit_bias[7]"),
    ({"logit_bias": {i: 1.0 for i in range(301)}}, "parameters.logit_bias"),
])
def test_params_errors_name_the_field(kwargs: dict, field: str) -> None:
    with pytest.raises(ValueError) as err:
        GenerationParams.validate(**kwargs)
    assert str(err.value).startswith(field + ":"), str(err.value)


def test_top_logprobs_implies_logprobs() -> None:
    assert GenerationParams.validate(top_logprobs=3).wants_logprobs


def test_score_tokens_gives_each_rows_log_softmax_and_its_best_first_alternatives() -> None:
    """Worked by hand: row [0, ln 3] is the distribution (1/4, 3/4); row [2, 2, 0] ties its first two tokens."""
    from server.generation.sampling import score_tokens

    logits = np.array([[0.0, np.log(3.0), -np.inf], [2.0, 2.0, 0.0]], dtype=np.float32)
    first, second = score_tokens(logits, np.array([0, 2]), top=2)
    assert first.token_id == 0 and first.logprob == pytest.approx(np.log(0.25), abs=1e-6)
    assert [t for t, _ in first.top] == [1, 0] and first.top[0][1] == pytest.approx(np.log(0.75), abs=1e-6)
    share = np.exp(2.0) / (2 * np.exp(2.0) + 1)
    assert second.logprob == pytest.approx(np.log(1 - 2 * share), abs=1e-6)
    assert [t for t, _ in second.top] == [0, 1]           # a tie goes to the lower id
    assert score_tokens(logits, np.array([1, 1]), top=0)[0].top == ()
    many = np.random.default_rng(0).normal(size=(150, 7)).astype(np.float32)   # more rows than one block of 64
    ids = np.arange(150) % 7
    got = [c.logprob for c in score_tokens(many, ids, top=0)]
    want = [float(r[t] - r.max() - np.log(np.exp(r - r.max()).sum())) for r, t in zip(many.astype(np.float64), ids)]
    assert np.allclose(got, want, atol=1e-6)


def test_top_alternatives_break_ties_by_lower_id_even_at_the_cut() -> None:
    """Rows of many tied values: the n best are the plain sort's (value down, id up), including which of the tied
    values at the cut get in (argpartition, used before, picked any of them)."""
    from server.generation.sampling import score_tokens, top_n

    rows = np.random.default_rng(1).integers(0, 4, size=(40, 30)).astype(np.float32)
    for n in (1, 3, 9, 20):
        want = [sorted(range(30), key=lambda k: (-row[k], k))[:n] for row in rows]
        assert [[t for t, _ in top_n(row.astype(np.float64), n)] for row in rows] == want
        # score_tokens ranks a row's log-softmax, which keeps the order and the ties of the row
        assert [[t for t, _ in c.top] for c in score_tokens(rows, np.zeros(40, dtype=np.int64), n)] == want


def test_config_rejects_nonpositive_sizes() -> None:
    with pytest.raises(ValueError, match="generation.max_batch_size"):
        GenerationConfig(max_batch_size=0)


@pytest.mark.parametrize(("field", "value", "bound"), [("decode_run_ms", 10_001, "10000"),
                                                       ("arrival_window_ms", -1, "1000"),
                                                       ("arrival_quiet_ms", True, "1000"),
                                                       ("arrival_quiet_ms", "1", "1000")])
def test_config_rejects_times_out_of_range_by_name(field: str, value: object, bound: str) -> None:
    with pytest.raises(ValueError, match=rf"generation\.{field}: must be in \[0, {bound}\], got {value!r}"):
        GenerationConfig(**{field: value})

# ---------------------------------------------------------------- sampling


def test_repetition_penalty_divides_positive_and_multiplies_negative() -> None:
    scores = np.array([2.0, -2.0, 3.0, -1.0])
    seen = np.array([True, True, False, False])
    assert apply_repetition_penalty(scores, seen, 2.0).tolist() == [1.0, -4.0, 3.0, -1.0]


def test_repetition_penalty_changes_the_greedy_choice() -> None:
    # Token 0 leads (3.0 vs 2.0); once seen with penalty 2 it drops to 1.5 and token 1 wins.
    logits = np.array([3.0, 2.0, 0.0], dtype=np.float32)
    plain = Sampler(GenerationParams.validate(), 3, prompt_ids=[0])
    penalized = Sampler(GenerationParams.validate(repetition_penalty=2.0), 3, prompt_ids=[0])
    assert plain.choose(logits).token_id == 0
    assert penalized.choose(logits).token_id == 1


def test_presence_and_frequency_penalties_count_generated_tokens_only() -> None:
    # Prompt token 0 does not count; token 1 generated twice, token 2 once.
    params = GenerationParams.validate(presence_penalty=0.5, frequency_penalty=0.25, top_logprobs=4)
    sampler = Sampler(params, 4, prompt_ids=[0, 0])
    for token in (1, 1, 2):
        sampler.observe(token)
    logits = np.array([1.0, 2.0, 1.5, 0.0], dtype=np.float32)
    # 1: 2 - 0.5 - 2 * 0.25 = 1.0; 2: 1.5 - 0.5 - 0.25 = 0.75; 0 and 3 untouched.
    expected = np.array([1.0, 1.0, 0.75, 0.0])
    choice = sampler.choose(logits)
    assert choice.token_id == 0                      # ties go to the lower id
    want = expected - np.log(np.exp(expected).sum())
    assert dict(choice.top) == pytest.approx({i: want[i] for i in range(4)})


def test_logit_bias_keys_may_be_json_strings() -> None:
    assert GenerationParams.validate(logit_bias={"7": 1, 3: -2.5}).logit_bias == ((3, -2.5), (7, 1.0))
    for bad in ({"x": 1.0}, {"-3": 1.0}, {"٣": 1.0}):      # not an ASCII decimal id
        with pytest.raises(ValueError, match=r"^parameters\.logit_bias: keys must be non-negative token ids"):
            GenerationParams.validate(logit_bias=bad)


def test_logit_bias_is_added_before_everything_else() -> None:
    logits = np.array([3.0, 2.0, 0.0], dtype=np.float32)
    biased = Sampler(GenerationParams.validate(logit_bias={2: 5.0, 0: -100.0}, logprobs=True), 3, prompt_ids=[])
    choice = biased.choose(logits)
    assert choice.token_id == 2
    assert choice.logprob == pytest.approx(5.0 - np.log(np.exp(-97.0) + np.exp(2.0) + np.exp(5.0)))
    assert logits.tolist() == [3.0, 2.0, 0.0]        # the caller's logits are not modified


def test_min_p_keeps_tokens_within_its_share_of_the_likeliest_and_leaves_logprobs_alone() -> None:
    logits = np.log(np.array([0.5, 0.3, 0.15, 0.05]))
    for min_p, allowed in ((0.2, {0, 1, 2}), (0.5, {0, 1})):      # thresholds 0.10 and 0.25
        sampler = Sampler(GenerationParams.validate(temperature=1.0, min_p=min_p, seed=3, top_logprobs=4), 4, [])
        choices = [sampler.choose(logits) for _ in range(600)]
        assert {c.token_id for c in choices} == allowed
        assert dict(choices[0].top) == pytest.approx({i: np.log(p) for i, p in enumerate([0.5, 0.3, 0.15, 0.05])})


def test_min_tokens_masks_eos_and_stop_ids_until_enough_are_generated() -> None:
    logits = np.array([1.0, 2.0, 3.0, 0.0], dtype=np.float32)       # eos (2) leads, then stop id 1, then 0
    sampler = Sampler(GenerationParams.validate(min_tokens=2, stop_token_ids=[1], logprobs=True), 4, [], eos_id=2)
    picks = []
    for _ in range(3):
        choice = sampler.choose(logits)
        picks.append(choice.token_id)
        sampler.observe(choice.token_id)
    assert picks == [0, 0, 2]
    assert Sampler(GenerationParams.validate(), 4, [], eos_id=2).choose(logits).token_id == 2


def test_rows_under_min_tokens_are_chosen_together_as_each_would_be_alone() -> None:
    """choose_rows takes greedy rows still under min_tokens in one masked argmax: the same tokens as each row's
    own choose() (float64, enders masked) on random logits with ties, and the caller's logits stay as they were."""
    rng = np.random.default_rng(0)
    logits = rng.integers(0, 4, size=(9, 6)).astype(np.float32)       # small integers: ties everywhere
    logits[:, 2] = 5.0                                                  # eos leads every row ...
    logits[1::3, 0] = 5.0                                               # ... tied with an earlier id in some
    logits[2::3, 5] = 5.0                                               # ... and with a later one in others
    kept = logits.copy()

    def samplers() -> list[Sampler]:
        kinds = [dict(min_tokens=3), dict(min_tokens=3, stop_token_ids=[4]), dict(), dict(min_tokens=1),
                 dict(temperature=0.7, seed=1, min_tokens=2), dict(min_tokens=2, logprobs=True)]
        return [Sampler(GenerationParams.validate(**kinds[i % len(kinds)]), 6, [], eos_id=2) for i in range(9)]
    together, alone = samplers(), samplers()
    for step in range(4):
        got = [c.token_id for c in choose_rows(together, logits)]
        want = []
        for s, row in zip(alone, logits):
            c = s.choose(row)
            s.observe(c.token_id)
            want.append(c.token_id)
        assert got == want, step
    assert np.array_equal(logits, kept)
    # eos is held back exactly while min_tokens is not reached (rows 0 and 1: min_tokens 3)
    fresh = samplers()
    picks = [[c.token_id for c in choose_rows(fresh, logits)][0] for _ in range(4)]
    assert 2 not in picks[:3] and picks[3] == 2


def test_log_softmax_and_top_n() -> None:
    logp = log_softmax(np.log(np.array([0.5, 0.2, 0.3])))
    assert np.allclose(np.exp(logp), [0.5, 0.2, 0.3])
    assert [t for t, _ in top_n(logp, 2)] == [0, 2]
    # Ties resolve to the lower id, so the order is deterministic.
    assert [t for t, _ in top_n(np.zeros(5), 3)] == [0, 1, 2]


def test_sampling_frequencies_follow_the_distribution() -> None:
    probs = np.array([0.6, 0.3, 0.1])
    sampler = Sampler(GenerationParams.validate(temperature=1.0, seed=7), 3, prompt_ids=[])
    draws = np.bincount([sampler.choose(np.log(probs)).token_id for _ in range(4000)], minlength=3) / 4000
    assert np.allclose(draws, probs, atol=0.03)


def test_top_k_and_top_p_restrict_the_candidates() -> None:
    logits = np.log(np.array([0.4, 0.3, 0.2, 0.1]))
    top2 = Sampler(GenerationParams.validate(temperature=1.0, top_k=2, seed=1), 4, prompt_ids=[])
    assert {top2.choose(logits).token_id for _ in range(300)} == {0, 1}
    # Nucleus 0.75: 0.4 + 0.3 = 0.7 < 0.75, so the third token is needed too; the fourth never.
    nucleus = Sampler(GenerationParams.validate(temperature=1.0, top_p=0.75, seed=1), 4, prompt_ids=[])
    assert {nucleus.choose(logits).token_id for _ in range(500)} == {0, 1, 2}


@pytest.mark.parametrize("scale", [0.01, 1.0, 8.0])   # flat (the prefix needs most tokens) to peaked
@pytest.mark.parametrize("top_p", [0.1, 0.9, 0.999])
def test_nucleus_equals_a_full_sort(scale: float, top_p: float) -> None:
    rng = np.random.default_rng(int(scale * 100) + int(top_p * 1000))
    probs = np.exp(rng.standard_normal(3000) * scale)
    probs /= probs.sum()
    order = np.argsort(-probs, kind="stable")
    cum = np.cumsum(probs[order])
    expected = set(order[: int(np.argmax(cum >= top_p)) + 1].tolist())
    kept, kept_probs = nucleus(np.arange(3000), probs, top_p)
    assert set(kept.tolist()) == expected
    assert kept_probs.sum() == pytest.approx(1.0) and (np.diff(kept_probs) <= 0).all()


def test_logprobs_are_taken_before_truncation_and_after_temperature() -> None:
    logits = np.log(np.array([0.5, 0.25, 0.25]))
    sampler = Sampler(GenerationParams.validate(temperature=0.5, top_k=1, seed=0, top_logprobs=3), 3, [])
    choice = sampler.choose(logits)
    # softmax(log p / 0.5) ∝ p²: 0.25, 0.0625, 0.0625 → 2/3, 1/6, 1/6.
    assert choice.token_id == 0
    assert choice.logprob == pytest.approx(np.log(2 / 3))
    assert [round(np.exp(lp), 6) for _, lp in choice.top] == [round(2 / 3, 6), round(1 / 6, 6), round(1 / 6, 6)]

# ---------------------------------------------------------------- stop sequences


def _stop_reference(text: str, stops: list[str]) -> str:
    """Generation order: walk the text character by character; at the first character where some stop
    sequence ends, cut before the longest one ending there (generation would have stopped there)."""
    for end in range(1, len(text) + 1):
        ending = [s for s in stops if text[:end].endswith(s)]
        if ending:
            return text[:end - max(len(s) for s in ending)]
    return text


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(alphabet="abx", max_size=4), max_size=12),
       st.lists(st.text(alphabet="abx", min_size=1, max_size=3), min_size=1, max_size=3))
def test_stop_matcher_equals_cutting_the_whole_text(pieces: list[str], stops: list[str]) -> None:
    matcher = StopMatcher(stops)
    out = ""
    for piece in pieces:
        released = matcher.feed(piece)
        out += released
        # Released text never contains a stop sequence, even across piece boundaries.
        assert not any(s in out for s in stops)
        if matcher.stopped:
            break
    out += matcher.flush()
    assert out == _stop_reference("".join(pieces), stops)
    assert matcher.stopped == (out != "".join(pieces) or any(s in "".join(pieces) for s in stops))


def test_stop_matcher_holds_back_a_possible_prefix() -> None:
    matcher = StopMatcher(["END"])
    assert matcher.feed("the E") == "the "
    assert matcher.feed("N") == ""
    assert matcher.feed("ough") == "ENough"
    assert matcher.feed(" END tail") == " " and matcher.stopped

# ---------------------------------------------------------------- detokenization


@pytest.fixture(scope="module")
def bpe_tokenizer(tiny_repository: Path) -> Tokenizer:
    return Tokenizer.from_file(str(tiny_repository / "tiny-gpt" / "1" / "tokenizer.json"))


def byte_token_ids(tokenizer: Tokenizer, text: str) -> list[int]:
    """One id per UTF-8 byte of text (the byte-level alphabet's single-byte tokens)."""
    pieces = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False).pre_tokenize_str(text)
    ids = [tokenizer.token_to_id(ch) for piece, _ in pieces for ch in piece]
    assert None not in ids and len(ids) == len(text.encode("utf-8"))
    return ids


def test_detokenizer_never_splits_a_character(bpe_tokenizer: Tokenizer) -> None:
    text = "é漢🙂 ok"
    detok = IncrementalDetokenizer(bpe_tokenizer, prompt_ids=bpe_tokenizer.encode("Say:").ids)
    pieces = [detok.push(t) for t in byte_token_ids(bpe_tokenizer, text)] + [detok.flush()]
    assert "".join(pieces) == text
    # é is 2 bytes, 漢 3, 🙂 4: text appears exactly when a character completes.
    assert pieces[:9] == ["", "é", "", "", "漢", "", "", "", "🙂"]


@settings(max_examples=60, deadline=None)
@given(st.text(max_size=12), st.data())
def test_detokenized_stream_equals_full_decode(bpe_tokenizer: Tokenizer, text: str, data: st.DataObject) -> None:
    # Mix BPE merges with raw byte tokens so token boundaries fall anywhere inside characters.
    ids = bpe_tokenizer.encode(text).ids if data.draw(st.booleans()) else byte_token_ids(bpe_tokenizer, text)
    detok = IncrementalDetokenizer(bpe_tokenizer, prompt_ids=[])
    pieces = [detok.push(t) for t in ids]
    assert all("\ufffd" not in p for p in pieces)
    assert "".join(pieces) + detok.flush() == text


@settings(max_examples=60, deadline=None)
@given(st.text(max_size=12), st.data())
def test_ids_pushed_together_give_the_text_pushed_one_by_one(bpe_tokenizer: Tokenizer, text: str,
                                                             data: st.DataObject) -> None:
    """push_many (a streamed interval's tokens decoded at once, sequence.catch_up) releases what push would in all,
    or refuses (None) when the ids end inside a character and leaves the detokenizer as it was."""
    ids = bpe_tokenizer.encode(text).ids if data.draw(st.booleans()) else byte_token_ids(bpe_tokenizer, text)
    together, alone = IncrementalDetokenizer(bpe_tokenizer, prompt_ids=[]), IncrementalDetokenizer(bpe_tokenizer,
                                                                                                  prompt_ids=[])
    got, want, i = [], [], 0
    while i < len(ids):
        group = ids[i:i + data.draw(st.integers(1, 4))]
        i += len(group)
        want.append("".join(alone.push(t) for t in group))
        text_of_group = together.push_many(group)
        if text_of_group is None:
            assert "\ufffd" in bpe_tokenizer.decode(ids[:i])     # refused only inside a character
            text_of_group = "".join(together.push(t) for t in group)
        got.append(text_of_group)
    assert "".join(got) + together.flush() == "".join(want) + alone.flush() == text


def test_a_streamed_interval_gives_the_per_token_answer_in_fewer_chunks(bpe_tokenizer: Tokenizer) -> None:
    """Tokens streamed in intervals wait without text (Sequence.quiet) and are decoded together when their chunk goes
    out: the same text and tokens as a message per token, the first token alone at once, every chunk between the
    first and the last holding at least the interval — also where an interval ends inside a character."""
    from server.generation.outputs import emit_token
    from server.generation.sampling import Choice

    ids = byte_token_ids(bpe_tokenizer, "é漢🙂 ok") + bpe_tokenizer.encode(" and more words here").ids

    def stream(interval: int, whole: bool = False) -> list:
        params = GenerationParams.validate(max_new_tokens=len(ids), ignore_eos=True)
        seq = Sequence.create([ids[0]], params, bpe_tokenizer, bpe_tokenizer.get_vocab_size(), None,
                              stream_interval=interval)
        seq.whole = whole
        for i, token in enumerate(ids):
            emit_token(seq, Choice(token, None, ()), bpe_tokenizer, "length" if i == len(ids) - 1 else None)
        out = []
        while not seq.queue.empty():
            out.append(seq.queue.get_nowait())
        return out
    per_token = stream(1)
    for interval, whole in ((2, False), (3, False), (5, False), (1, True)):
        got = stream(interval, whole)
        assert "".join(c.text for c in got) == "".join(c.text for c in per_token) == "é漢🙂 ok and more words here"
        assert [t.token_id for c in got for t in c.tokens] == [t.token_id for c in per_token for t in c.tokens]
        if whole:
            assert len(got) == 1
            continue
        assert len(got[0].tokens) == 1 and got[-1].final
        assert all(len(c.tokens) >= interval for c in got[1:-1]) and len(got) < len(per_token)


def test_detokenizer_releases_an_unfinished_character_at_the_end(bpe_tokenizer: Tokenizer) -> None:
    detok = IncrementalDetokenizer(bpe_tokenizer, prompt_ids=[])
    first = byte_token_ids(bpe_tokenizer, "漢")[0]
    assert detok.push(first) == ""
    assert detok.flush() == "\ufffd"
