"""Parity checks of an in-place-cache decoder graph (export/decoder_graph.py) against the PyTorch model.

The graph is driven the way a serving engine drives it: one buffer per layer and kind,
`[slots, kv_heads, max_length, head_dim]`, bound as both past and present so the graph writes in place;
rows tell their write position through the attention mask. Every check compares with PyTorch run on each
sequence alone (no padding), so the reference cannot share a mistake with the batching:
  - rows of different lengths prefilled in one call (right padding), then decoded together;
  - a slot reused after its sequence left, beside rows that keep decoding;
  - a prompt prefilled in chunks equals the same prompt prefilled at once (and PyTorch);
  - greedy generation of 64 tokens gives PyTorch's ids.
"""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import torch

from modelpkg import CACHE_ELEMENT_TYPES, MIXED_PREFIX, head_channels, past_name, present_name

from .parity_noise import NoiseScale

Check = tuple[str, bool, float, str, str]   # name, passed, max_abs_diff, worst output, detail


def leading_equal(got: list[int], want: list[int]) -> int:
    """How many leading ids two greedy continuations share: the gates' greedy agreement, per prompt."""
    return next((k for k, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))


class SlotDriver:
    """Cache buffers + IOBinding calls of the graph (the contract of docs/model-package.md, no server code)."""

    def __init__(self, sess: ort.InferenceSession, num_layers: int, kv_heads: int, head_dim: int,
                 max_length: int, slots: int) -> None:
        """head_dim: the model's head size. The buffers take the graph's cache shape, whose head size is larger
        when the export padded the heads; cache() then reads the model's channels out of it."""
        self.sess, self.max_length = sess, max_length
        self.names = [(past_name(i, k), present_name(i, k)) for i in range(num_layers) for k in ("key", "value")]
        past = {i.name: i for i in sess.get_inputs()}[self.names[0][0]]
        dtype = CACHE_ELEMENT_TYPES[past.type]    # float32, or the kv8 variant's int8
        graph_dim = past.shape[3] if isinstance(past.shape[3], int) else head_dim
        self.channels = head_channels(head_dim, graph_dim)
        self.padding_channels = sorted(set(range(graph_dim)) - set(self.channels))
        self.bufs = {p: np.zeros((slots, kv_heads, max_length, graph_dim), dtype) for p, _ in self.names}
        self.positions = "position_ids" in {i.name for i in sess.get_inputs()}

    def run(self, lo: int, ids: np.ndarray, lens: np.ndarray, starts: np.ndarray) -> np.ndarray:
        """Rows = slots lo.. lo+B; row b writes its tokens at [lens[b] - S, lens[b]). Returns logits [B, S, V]."""
        b, s = ids.shape
        io = self.sess.io_binding()
        for past, present in self.names:
            view = ort.OrtValue.ortvalue_from_numpy(self.bufs[past][lo:lo + b])
            io.bind_ortvalue_input(past, view)
            io.bind_ortvalue_output(present, view)
        width = int(lens.max())
        io.bind_cpu_input("input_ids", ids.astype(np.int64))
        io.bind_cpu_input("attention_mask", (np.arange(width)[None] < lens[:, None]).astype(np.int64))
        if self.positions:
            pos = np.minimum(starts[:, None] + np.arange(s)[None], self.max_length - 1)
            io.bind_cpu_input("position_ids", pos.astype(np.int64))
        io.bind_output("logits")
        self.sess.run_with_iobinding(io)
        return io.get_outputs()[-1].numpy()

    def first_prompt(self, lo: int, prompts: list[list[int]], pad: int) -> np.ndarray:
        width = max(len(p) for p in prompts)
        ids = np.full((len(prompts), width), pad, np.int64)
        for r, p in enumerate(prompts):
            ids[r, :len(p)] = p
        return self.run(lo, ids, np.array([len(p) for p in prompts]), np.zeros(len(prompts), np.int64))

    def chunk(self, slot: int, tokens: list[int], start: int) -> np.ndarray:
        return self.run(slot, np.array([tokens]), np.array([start + len(tokens)]), np.array([start]))[0]

    def decode(self, tokens: list[int], positions: list[int]) -> np.ndarray:
        """Slots 0..len(tokens)-1, one token each at its position → logits [B, V]."""
        pos = np.array(positions)
        return self.run(0, np.array(tokens)[:, None], pos + 1, pos)[:, 0]

    def cache(self, slot: int, length: int) -> list[np.ndarray]:
        """Per layer and kind, the slot's first `length` positions over the model's channels [kv_heads, length, d]."""
        if not self.padding_channels:
            return [self.bufs[p][slot, :, :length] for p, _ in self.names]
        return [self.bufs[p][slot, :, :length][..., self.channels] for p, _ in self.names]

    def padding(self, slot: int, length: int) -> list[np.ndarray]:
        """The padded heads' extra channels over the same positions (empty list when the heads are not padded)."""
        if not self.padding_channels:
            return []
        return [self.bufs[p][slot, :, :length][..., self.padding_channels] for p, _ in self.names]


class InplaceChecks:
    def __init__(self, model: torch.nn.Module, stream: np.ndarray, num_layers: int, kv_heads: int, head_dim: int,
                 max_length: int, pad_id: int, atol: float, rtol: float, greedy_tokens: int,
                 cache_atol: float | None = None) -> None:
        self.model, self.stream = model, stream
        self.dims = (num_layers, kv_heads, head_dim, max_length)
        self.pad, self.atol, self.rtol, self.greedy_tokens = pad_id, atol, rtol, greedy_tokens
        # An int8 cache compared with another graph's int8 cache: how many quantization steps may differ (a value
        # that lands on a rounding boundary can round either way after a tiny difference upstream). None: atol.
        self.cache_atol = cache_atol
        self.cache_worst = 0.0     # the largest cache difference of the last _compare that had cache_atol
        self._greedy_refs: dict[tuple[tuple[int, ...], int], list[int]] = {}
        # fp32: the tolerance follows PyTorch's own float noise (export/parity_noise.py: noise, and model64 the
        # model's float64 twin, set by the caller); judgements: per _compare, the (atols, noise) it judged by
        self.noise: NoiseScale | None = None
        self.model64: torch.nn.Module | None = None
        self.judgements: list[tuple[dict[str, float], dict[str, float]]] = []

    # -- references

    def _torch(self, ids: list[int]) -> tuple[np.ndarray, list[np.ndarray]]:
        with torch.no_grad():
            logits, presents = self.model(torch.tensor([ids], dtype=torch.long))
            if self.noise is not None and self.model64 is not None:
                logits64, presents64 = self.model64(torch.tensor([ids], dtype=torch.long))
                self.noise.record("logits", logits[0], logits64[0])
                for pair, pair64 in zip(presents, presents64):
                    for t, t64 in zip(pair, pair64):
                        self.noise.record("cache", t[0], t64[0])
        flat = []
        for k, v in presents:
            flat += [k[0].numpy(), v[0].numpy()]
        return logits[0].numpy(), flat

    def _diff(self, got: np.ndarray, want: np.ndarray, atol: float | None = None,
              rtol: float | None = None) -> tuple[float, bool]:
        if got.shape != want.shape or not np.isfinite(got).all():
            return float("inf"), False
        atol, rtol = self.atol if atol is None else atol, self.rtol if rtol is None else rtol
        want = want.astype(np.float64)      # an int8 cache: |-128| does not fit int8
        d = np.abs(got.astype(np.float64) - want)
        return float(d.max()), bool((d <= atol + rtol * np.abs(want)).all())

    def _compare(self, pairs: list[tuple[str, np.ndarray, np.ndarray]]) -> tuple[bool, float, str]:
        """(all within tolerance, the largest difference, where). With cache_atol, cache pairs are judged by it
        and their largest difference goes to cache_worst instead (other units than the logits')."""
        ok_all, worst, worst_name = True, 0.0, pairs[0][0]
        self.cache_worst = 0.0
        atols = self.noise.atols() if self.noise is not None else {}
        self.judgements += [(atols, dict(self.noise.last))] if self.noise is not None else []
        for name, got, want in pairs:
            if self.cache_atol is not None and "cache" in name:
                d, ok = self._diff(got, want, self.cache_atol, 0.0)
                ok_all &= ok
                self.cache_worst = max(self.cache_worst, d)
                if not ok:
                    worst_name = name
                continue
            output = "padding" if "padded" in name else "cache" if "cache" in name else "logits"   # (padding: floor)
            d, ok = self._diff(got, want, atols.get(output) if atols else None)
            ok_all &= ok
            if d > worst or not ok:
                worst, worst_name = max(worst, d), name
        return ok_all, worst, worst_name

    def _seq(self, length: int, offset: int) -> list[int]:
        start = (offset * 37) % max(1, len(self.stream) - length)
        return [int(t) for t in self.stream[start:start + length]]

    def _driver(self, sess: ort.InferenceSession, slots: int) -> SlotDriver:
        layers, kv, hd, max_len = self.dims
        return SlotDriver(sess, layers, kv, hd, max_len, slots)

    # -- checks

    def ragged_and_reuse(self, sess: ort.InferenceSession) -> list[Check]:
        d = self._driver(sess, 3)
        seqs = [self._seq(n, i) for i, n in enumerate((5, 11, 8))]
        logits = d.first_prompt(0, seqs, self.pad)
        pairs = []
        for r, s in enumerate(seqs):
            ref, cache = self._torch(s)
            pairs.append((f"row{r} logits", logits[r, :len(s)], ref))
            pairs += [(f"row{r} cache", got, want) for got, want in zip(d.cache(r, len(s)), cache)]
        steps = 4
        for t in range(steps):
            nxt = [int(self.stream[(7 * r + t) % len(self.stream)]) for r in range(3)]
            out = d.decode(nxt, [len(s) for s in seqs])
            for r in range(3):
                seqs[r] = seqs[r] + [nxt[r]]
                pairs.append((f"row{r} step logits", out[r], self._torch(seqs[r])[0][-1]))
        for r, s in enumerate(seqs):
            pairs += [(f"row{r} cache after steps", got, want)
                      for got, want in zip(d.cache(r, len(s)), self._torch(s)[1])]
            # Zero-padded heads: their extra channels must stay zero (else they would add to q.k and the output).
            pairs += [(f"row{r} padded head channels", got, np.zeros_like(got)) for got in d.padding(r, len(s))]
        ok1, d1, w1 = self._compare(pairs)
        checks: list[Check] = [("rows of different lengths in one batch", ok1, d1, w1,
                                "prompts 5/11/8 right-padded in one call, then 4 decode steps together")]
        # Slot 1's sequence leaves; a shorter one takes the slot while rows 0 and 2 keep decoding.
        seqs[1] = self._seq(3, 9)
        fresh = d.first_prompt(1, [seqs[1]], self.pad)[0]
        pairs = [("reused slot prefill", fresh, self._torch(seqs[1])[0])]
        for t in range(3):
            nxt = [int(self.stream[(11 * r + t) % len(self.stream)]) for r in range(3)]
            out = d.decode(nxt, [len(s) for s in seqs])
            for r in range(3):
                seqs[r] = seqs[r] + [nxt[r]]
                pairs.append((f"row{r} after reuse", out[r], self._torch(seqs[r])[0][-1]))
        pairs += [("reused slot cache", got, want) for got, want in zip(d.cache(1, len(seqs[1])), self._torch(seqs[1])[1])]
        ok2, d2, w2 = self._compare(pairs)
        checks.append(("slot reused after its sequence left", ok2, d2, w2,
                       "slot 1 re-prefilled with a 3-token prompt beside rows still decoding"))
        return checks

    def chunked(self, sess: ort.InferenceSession) -> list[Check]:
        seq = self._seq(min(20, self.dims[3] - 1), 5)
        whole = self._driver(sess, 1)
        at_once = whole.first_prompt(0, [seq], self.pad)[0]
        parts = self._driver(sess, 1)
        cuts = [0, 7, 14, len(seq)]
        chunks = [parts.chunk(0, seq[a:b], a) if a else parts.first_prompt(0, [seq[a:b]], self.pad)[0]
                  for a, b in zip(cuts, cuts[1:])]
        chunked = np.concatenate(chunks, axis=0)
        ref, cache = self._torch(seq)
        pairs = [("chunked vs at once logits", chunked, at_once.astype(np.float64)), ("chunked logits", chunked, ref)]
        pairs += [("chunked vs at once cache", a, b.astype(np.float64))
                  for a, b in zip(parts.cache(0, len(seq)), whole.cache(0, len(seq)))]
        pairs += [("chunked cache", a, b) for a, b in zip(parts.cache(0, len(seq)), cache)]
        ok, d, w = self._compare(pairs)
        return [("prefill in chunks == prefill at once", ok, d, w, f"{len(seq)} tokens as chunks of 7/7/{len(seq) - 14}")]

    def _torch_greedy(self, prompt: list[int], new: int) -> list[int]:
        key = (tuple(prompt), new)
        if key not in self._greedy_refs:    # several variants are judged against the same references
            self._greedy_refs[key] = self._torch_greedy_run(prompt, new)
        return self._greedy_refs[key]

    def _torch_greedy_run(self, prompt: list[int], new: int) -> list[int]:
        ids = list(prompt)
        with torch.no_grad():
            logits, past = self.model(torch.tensor([ids]))
            for _ in range(new):
                nxt = int(logits[0, -1].argmax())
                ids.append(nxt)
                mask = torch.ones(1, len(ids), dtype=torch.long)
                logits, past = self.model(torch.tensor([[nxt]]), mask, past_key_values=past)
        return ids[len(prompt):]

    def _graph_greedy(self, sess: ort.InferenceSession, prompts: list[list[int]], new: int) -> list[list[int]]:
        """The prompts in one batch (right-padded prefill, then decode steps together): `new` ids each."""
        d = self._driver(sess, len(prompts))
        logits = d.first_prompt(0, prompts, self.pad)
        got: list[list[int]] = [[] for _ in prompts]
        tokens = [int(logits[r, len(p) - 1].argmax()) for r, p in enumerate(prompts)]
        for step in range(new):
            for r, t in enumerate(tokens):
                got[r].append(t)
            if step == new - 1:
                break
            out = d.decode(tokens, [len(p) + step for p in prompts])
            tokens = [int(out[r].argmax()) for r in range(len(prompts))]
        return got

    def greedy_prefixes(self, sess: ort.InferenceSession, prompts: list[list[int]], new: int,
                        group: int = 8) -> list[int]:
        """Per prompt: how many of the graph's first `new` greedy ids equal PyTorch's before the first difference
        (prompts decoded `group` at a time, as a server batches them)."""
        new = min(new, self.dims[3] - max(len(p) for p in prompts))
        same: list[int] = []
        for i in range(0, len(prompts), group):
            part = prompts[i:i + group]
            for p, got in zip(part, self._graph_greedy(sess, part, new)):
                want = self._torch_greedy(p, new)
                same.append(leading_equal(got, want))
        return same

    def greedy(self, sess: ort.InferenceSession) -> list[Check]:
        prompts = [self._seq(6, 2), self._seq(3, 4)]
        new = min(self.greedy_tokens, self.dims[3] - 6)
        want = [self._torch_greedy(p, new) for p in prompts]
        got = self._graph_greedy(sess, prompts, new)
        same = got == want
        detail = f"prompts 6 and 3 tokens in one batch, {new} steps" if same else \
            f"first difference at step {next(i for i in range(new) if any(g[i] != w[i] for g, w in zip(got, want)))}"
        return [(f"greedy {new} tokens identical ids", same, 0.0, "", detail)]

    def quantized_cache(self, sess: ort.InferenceSession, stream: np.ndarray, rows: int = 4, length: int = 48,
                        prompt: int = 8) -> tuple[int, int, float, float, float]:
        """Teacher-forced decoding through the graph's cache: `rows` windows of `stream` (text the cache was not
        calibrated on) are prefilled `prompt` tokens at once, then fed one true token per step, so every step
        attends to quantized keys/values. Returns (positions whose top-1 equals PyTorch's, positions, mean
        KL(PyTorch || graph) of the next-token distributions in nats, perplexity of the graph / PyTorch's on the
        next true token, largest |logit difference|)."""
        length = min(length, self.dims[3] - 1, len(stream))
        step = max(1, (len(stream) - length) // max(1, rows - 1))
        seqs = [[int(t) for t in stream[r * step:r * step + length]] for r in range(rows)]
        seqs = [s for s in seqs if len(s) == length]
        refs = [self._torch(s)[0] for s in seqs]
        d = self._driver(sess, len(seqs))
        d.first_prompt(0, [s[:prompt] for s in seqs], self.pad)
        agree = total = 0
        nll_got = nll_ref = worst = kl = 0.0
        for pos in range(prompt, length - 1):
            out = d.decode([s[pos] for s in seqs], [pos] * len(seqs))
            for r, s in enumerate(seqs):
                got, ref, nxt = out[r].astype(np.float64), refs[r][pos].astype(np.float64), s[pos + 1]
                agree += int(got.argmax() == ref.argmax())
                total += 1
                log_got, log_ref = got - _logsumexp(got), ref - _logsumexp(ref)
                kl += float((np.exp(log_ref) * (log_ref - log_got)).sum())
                nll_got -= log_got[nxt]
                nll_ref -= log_ref[nxt]
                worst = max(worst, float(np.abs(got - ref).max()))
        ratio = float(np.exp((nll_got - nll_ref) / max(1, total)))
        return agree, total, kl / max(1, total), ratio, worst

    def alone(self, sess: ort.InferenceSession, ids: list[int]) -> tuple[np.ndarray, list[np.ndarray]]:
        """The plain graph on one sequence in a slot of its own, prompt at once: (logits [S, V], cache per layer
        and kind). With an int8 cache this is the reference for the mixed graph (PyTorch has no int8 cache)."""
        d = self._driver(sess, 1)
        logits = d.first_prompt(0, [ids], self.pad)[0]
        return logits, [c.copy() for c in d.cache(0, len(ids))]

    def mixed(self, sess: ort.InferenceSession, mixed_sess: ort.InferenceSession, reference=None,
              same_schedule: bool = False) -> list[Check]:
        """The mixed graph: rows decoding (slots 0..2) and a prompt chunk (slot 1's, inside that range, and
        slot 3's, outside it) in the same run, against PyTorch (or `reference(ids) -> (logits, cache)`), or with
        same_schedule against the plain graph making the same calls one group at a time (decode rows, then the
        chunk): the yardstick for kernels whose results depend on the shape of the call (MatMulNBits at accuracy
        level 4 moves a prompt's logits when the same prompt is fed with one token more: bench/FINDINGS.md,
        "Weight-quantized decoders (issue 23)")."""
        layers, kv, hd, max_len = self.dims
        d = SlotDriver(sess, layers, kv, hd, max_len, 4)
        got, seqs = self._mixed_schedule(d, MixedDriver(d, mixed_sess))
        if same_schedule:
            twin = SlotDriver(sess, layers, kv, hd, max_len, 4)
            want, _ = self._mixed_schedule(twin, PlainDriver(twin))
            pairs = [(name, a, b) for (name, a), (_, b) in zip(got, want)]
            pairs += [(f"mixed cache slot {r}", a, b) for r in range(3)
                      for a, b in zip(d.cache(r, len(seqs[r])), twin.cache(r, len(seqs[r])))]
        else:
            ref = reference or self._torch
            pairs = [(name, a, ref(ids)[0][-1] if pos is None else ref(ids)[0][pos:])
                     for (name, a), (ids, pos) in zip(got, self._mixed_refs)]
            pairs += [(f"mixed cache slot {r}", a, b) for r in range(3)
                      for a, b in zip(d.cache(r, len(seqs[r])), ref(seqs[r])[1])]
        ok, diff, worst = self._compare(pairs)
        detail = "slots 0/2 decode while slot 1 prefills 3 chunks, then 0/1/2 decode beside slot 3's first prompt"
        if self.cache_atol is not None:
            detail += f"; int8 caches within {self.cache_atol:g} step (largest difference {self.cache_worst:g})"
        return [("mixed graph: decode rows and a prompt chunk in one run", ok, diff, worst, detail)]

    def _mixed_schedule(self, d: "SlotDriver", runner: "MixedDriver | PlainDriver"
                        ) -> tuple[list[tuple[str, np.ndarray]], list[list[int]]]:
        """The mixed check's calls on `d` through `runner`: (named outputs, the three decoding slots' sequences).
        Sets self._mixed_refs: per output, (the ids whose logits it should equal, None = the last position or
        the chunk's first position)."""
        max_len = self.dims[3]
        seqs = [self._seq(6, 20), [], self._seq(9, 22)]      # slot 1 starts empty: its prompt comes in chunks
        d.first_prompt(0, [seqs[0]], self.pad)
        d.first_prompt(2, [seqs[2]], self.pad)
        long = self._seq(min(24, max_len - 8), 33)
        other = self._seq(min(10, max_len - 8), 44)
        out: list[tuple[str, np.ndarray]] = []
        refs: list[tuple[list[int], int | None]] = []
        # slot 1 prefills `long` in chunks of 8 while slots 0 and 2 decode (slot 1 sits in the decode range)
        for step, start in enumerate(range(0, len(long), 8)):
            nxt = [int(self.stream[(5 * r + step) % len(self.stream)]) for r in (0, 2)]
            chunk = long[start:start + 8]
            dec, pre = runner.run([(0, nxt[0], len(seqs[0])), (2, nxt[1], len(seqs[2]))], {1: start + len(chunk)},
                                  1, chunk, start)
            seqs[0], seqs[2] = seqs[0] + [nxt[0]], seqs[2] + [nxt[1]]
            out += [("mixed decode row 0", dec[0]), ("mixed decode row 2", dec[1]),
                    ("mixed chunk (inside the decode range)", pre)]
            refs += [(seqs[0], None), (seqs[2], None), (long[:start + len(chunk)], start)]
        # slot 3 (outside the decode range) takes a first prompt while 0, 1 and 2 decode
        seqs[1] = long
        nxt = [int(self.stream[(3 * r + 7) % len(self.stream)]) for r in range(3)]
        dec, pre = runner.run([(r, nxt[r], len(seqs[r])) for r in range(3)], {}, 3, other, 0)
        for r in range(3):
            seqs[r] = seqs[r] + [nxt[r]]
            out.append((f"mixed decode row {r} beside a first prompt", dec[r]))
            refs.append((seqs[r], None))
        out.append(("mixed first prompt", pre))
        refs.append((other, 0))
        self._mixed_refs = refs
        return out, seqs

    def run_all(self, sess: ort.InferenceSession, mixed: ort.InferenceSession | None = None) -> list[Check]:
        checks = [*self.ragged_and_reuse(sess), *self.chunked(sess), *self.greedy(sess)]
        return checks + (self.mixed(sess, mixed) if mixed is not None else [])


class MixedDriver:
    """Runs the mixed graph on a SlotDriver's buffers: decode rows over slots [0, hi) plus one chunk."""

    def __init__(self, slots: SlotDriver, sess: ort.InferenceSession) -> None:
        self.d, self.sess = slots, sess

    def run(self, rows: list[tuple[int, int, int]], idle: dict[int, int], chunk_slot: int, chunk: list[int],
            start: int) -> tuple[np.ndarray, np.ndarray]:
        """rows: (slot, token, position); idle: slot -> harmless write position. -> (decode logits in row
        order [n, V], chunk logits [len(chunk), V])."""
        d = self.d
        hi, tokens, pos = _decode_feed(rows, idle)
        io = self.sess.io_binding()
        groups = [("", 0, hi, tokens, pos + 1, pos), (MIXED_PREFIX, chunk_slot, chunk_slot + 1, np.array([chunk]),
                                                       np.array([start + len(chunk)]), np.array([start]))]
        for prefix, lo, top, *_ in groups:       # caches first: the two logits are then the last outputs
            for past, present in d.names:
                view = ort.OrtValue.ortvalue_from_numpy(d.bufs[past][lo:top])
                io.bind_ortvalue_input(prefix + past, view)
                io.bind_ortvalue_output(prefix + present, view)
        for prefix, lo, top, ids, lens, starts in groups:
            width = int(lens.max())
            io.bind_cpu_input(prefix + "input_ids", ids)
            io.bind_cpu_input(prefix + "attention_mask", (np.arange(width)[None] < lens[:, None]).astype(np.int64))
            if d.positions:
                p = np.minimum(starts[:, None] + np.arange(ids.shape[1])[None], d.max_length - 1)
                io.bind_cpu_input(prefix + "position_ids", p.astype(np.int64))
            io.bind_output(prefix + "logits")
        self.sess.run_with_iobinding(io)
        outs = io.get_outputs()
        dec, pre = outs[-2].numpy(), outs[-1].numpy()
        return dec[[s for s, _, _ in rows], 0], pre[0]


class PlainDriver:
    """The mixed driver's calls made by the plain graph: the decode rows in one run, then the chunk in another."""

    def __init__(self, slots: SlotDriver) -> None:
        self.d = slots

    def run(self, rows: list[tuple[int, int, int]], idle: dict[int, int], chunk_slot: int, chunk: list[int],
            start: int) -> tuple[np.ndarray, np.ndarray]:
        hi, tokens, pos = _decode_feed(rows, idle)
        dec = self.d.run(0, tokens, pos + 1, pos)
        pre = self.d.chunk(chunk_slot, chunk, start)
        return dec[[s for s, _, _ in rows], 0], pre


def _decode_feed(rows: list[tuple[int, int, int]], idle: dict[int, int]) -> tuple[int, np.ndarray, np.ndarray]:
    """A decode call over slots [0, hi): (hi, token per slot [hi, 1], position per slot), idle slots writing at
    their harmless position."""
    hi = max(s for s, _, _ in rows) + 1
    tokens, pos = np.zeros((hi, 1), np.int64), np.zeros(hi, np.int64)
    for slot, p in idle.items():
        pos[slot] = p
    for slot, t, p in rows:
        tokens[slot, 0], pos[slot] = t, p
    return hi, tokens, pos


def _logsumexp(x: np.ndarray) -> float:
    m = float(x.max())
    return m + float(np.log(np.exp(x - m).sum()))
