"""The parity gate of an encoder-decoder package (export/seq2seq_graph.py) against the PyTorch model.

The graphs are driven the way a serving engine drives them (docs/model-package.md, "Encoder-decoder packages"):
the encoder runs on a right-padded batch of sources and each row's cross keys/values are copied into its slot
of a cross buffer [slots, heads, max_source_length, head_dim]; the decoder binds a slot range of that buffer
(its full width, so stale values of an earlier, longer source sit beyond a row's own) and of the self cache
[slots, heads, max_target_length, head_dim] as past and present (written in place). Every figure compares with
PyTorch run on each sequence ALONE (no padding), so the reference cannot share a mistake with the batching:
  - encoder: sources of different lengths in one call -> cross keys/values per row (padded channels 0);
  - decoder: targets of different lengths in one right-padded first call, then 4 steps together;
  - a slot reused by a new request (another source length) while the other rows keep decoding;
  - greedy decoding of 6 sources batched gives PyTorch's ids (training.seq2seq.generate_greedy);
  - with `transformers` installed, the teacher-forced logits of the ragged batch equal its model's too.
A breach fails the export (exit 1, figures printed, nothing published).
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch

from modelpkg import cross_name, head_channels, past_name, present_name

from .parity_inputs import session
from .parity_noise import NOISE_FACTOR, NoiseScale, float64_twin
from .parity_results import Check, VariantResult

log = logging.getLogger(__name__)

SOURCE_LENGTHS = (11, 7, 3)     # the ragged batch
TARGET_LENGTHS = (4, 6, 2)      # its first call (decoder start token included)
STEPS = 4                       # decode steps after it
REUSE_SOURCE, REUSE_PREFIX = 5, 3
GREEDY_SOURCES, GREEDY_TOKENS = 6, 24


@dataclass
class Seq2SeqGateInputs:
    model: torch.nn.Module
    family: str
    num_layers: int
    num_heads: int
    head_dim: int               # the model's (the graphs' may be padded)
    padded_head_dim: int
    max_source_length: int
    max_target_length: int
    decoder_start: int
    eos: int
    pad: int
    target_vocab: int
    forced_bos: int | None
    forced_eos: int | None
    stream: list[int]           # source token ids to cut sources from (the packaged tokenizer on held-out text)
    atol: float
    rtol: float
    threads: int = 1
    noise_factor: float = NOISE_FACTOR   # the fp32 atol's float-noise rule (export/parity_noise.py)
    checkpoint: Path | None = None   # compared with transformers' model too when set and transformers imports
    held_out: list[list[int]] = field(default_factory=list)   # weight-quantized variants' sources (heldout.py)


class SlotDriver:
    """Cross and self-cache slot buffers + IOBinding calls of the two graphs (no server code)."""

    def __init__(self, enc: ort.InferenceSession, dec: ort.InferenceSession, inp: Seq2SeqGateInputs,
                 slots: int) -> None:
        self.enc, self.dec, self.inp = enc, dec, inp
        n, h, d = inp.num_layers, inp.num_heads, inp.padded_head_dim
        rng = np.random.default_rng(0)
        # Stale values (not zeros) beyond every row's source: the per-row mask must hide them.
        self.cross = {cross_name(i, k): rng.standard_normal((slots, h, inp.max_source_length, d)).astype(np.float32)
                      for i in range(n) for k in ("key", "value")}
        self.cache = {past_name(i, k): np.zeros((slots, h, inp.max_target_length, d), np.float32)
                      for i in range(n) for k in ("key", "value")}
        self.source_len = np.zeros(slots, np.int64)

    def encode(self, lo: int, sources: list[list[int]]) -> dict[str, np.ndarray]:
        """Encode a right-padded batch; copy each row's cross keys/values into slots lo.. ; returns the outputs."""
        width = max(len(s) for s in sources)
        ids = np.full((len(sources), width), self.inp.pad, np.int64)
        mask = np.zeros_like(ids)
        for r, s in enumerate(sources):
            ids[r, :len(s)], mask[r, :len(s)] = s, 1
        names = [o.name for o in self.enc.get_outputs()]
        outs = dict(zip(names, self.enc.run(names, {"input_ids": ids, "attention_mask": mask})))
        for r, s in enumerate(sources):
            for name, buf in self.cross.items():
                buf[lo + r, :, :len(s)] = outs[name][r, :, :len(s)]
            self.source_len[lo + r] = len(s)
        return outs

    def run(self, lo: int, ids: np.ndarray, lens: np.ndarray) -> np.ndarray:
        """Rows = slots lo .. lo+B; row b's tokens go to [lens[b] - T, lens[b]). Logits [B, T, V]."""
        b = ids.shape[0]
        io = self.dec.io_binding()
        for i in range(self.inp.num_layers):
            for k in ("key", "value"):
                view = ort.OrtValue.ortvalue_from_numpy(self.cache[past_name(i, k)][lo:lo + b])
                io.bind_ortvalue_input(past_name(i, k), view)
                io.bind_ortvalue_output(present_name(i, k), view)
        for name, buf in self.cross.items():
            io.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(buf[lo:lo + b]))
        enc_mask = (np.arange(self.inp.max_source_length)[None] < self.source_len[lo:lo + b, None]).astype(np.int64)
        io.bind_cpu_input("input_ids", ids.astype(np.int64))
        io.bind_cpu_input("attention_mask", (np.arange(int(lens.max()))[None] < lens[:, None]).astype(np.int64))
        io.bind_cpu_input("encoder_attention_mask", enc_mask)
        io.bind_output("logits")
        self.dec.run_with_iobinding(io)
        return io.get_outputs()[-1].numpy()

    def first(self, lo: int, targets: list[list[int]]) -> np.ndarray:
        width = max(len(t) for t in targets)
        ids = np.full((len(targets), width), self.inp.pad, np.int64)
        for r, t in enumerate(targets):
            ids[r, :len(t)] = t
        return self.run(lo, ids, np.array([len(t) for t in targets]))

    def step(self, tokens: list[int], lens: list[int]) -> np.ndarray:
        """Slots 0..len(tokens)-1, one token each; lens = each row's length after it. Logits [B, V]."""
        return self.run(0, np.array(tokens)[:, None], np.array(lens))[:, 0]


class Seq2SeqGate:
    def __init__(self, inp: Seq2SeqGateInputs) -> None:
        self.inp = inp
        self.channels = head_channels(inp.head_dim, inp.padded_head_dim)
        self.padding = sorted(set(range(inp.padded_head_dim)) - set(self.channels))
        self.rng = np.random.default_rng(1234)
        self._cross_cache: dict[tuple[int, ...], tuple[list, list]] = {}   # source -> (fp32, fp64) cross k/v
        # The fp32 tolerance follows the reference's own float noise (export/parity_noise.py).
        self.noise = NoiseScale(inp.atol, inp.rtol, inp.noise_factor)
        self.model64 = float64_twin(inp.model)

    # -- inputs and PyTorch references
    def _source(self, length: int, offset: int) -> list[int]:
        stream = self.inp.stream
        length = min(length, self.inp.max_source_length)
        return [stream[(offset + j) % len(stream)] for j in range(length)]

    def _target(self, length: int) -> list[int]:
        """Decoder start, then random target ids (teacher forcing needs no meaning)."""
        return [self.inp.decoder_start] + self._random_ids(length - 1)

    def _random_ids(self, n: int) -> list[int]:
        """Random target ids, the pad id replaced by the next: a pad fed mid-target has no defined position in
        M2M100 (transformers counts positions from the non-pad tokens without a cache, from the cache length with
        one), and a served target never holds one before its end."""
        pad, vocab = self.inp.pad, self.inp.target_vocab
        return [(t + 1) % vocab if t == pad else t for t in map(int, self.rng.integers(0, vocab, n))]

    def _cross(self, source: list[int], fp64: bool = False) -> list:
        """PyTorch's cross keys/values of a source (fp64: its float64 twin's); the noise between the two is
        recorded when a source is first seen."""
        key = tuple(source)
        if key not in self._cross_cache:
            ids = torch.tensor([source])
            with torch.no_grad():
                m, m64 = self.inp.model, self.model64
                pair = (m.cross_key_values(m.encode(ids)), m64.cross_key_values(m64.encode(ids)))
            self._cross_cache[key] = pair
            for i, ((k, v), (k64, v64)) in enumerate(zip(*pair)):
                self.noise.record(cross_name(i, "key"), k, k64)
                self.noise.record(cross_name(i, "value"), v, v64)
        return self._cross_cache[key][1 if fp64 else 0]

    def _decode(self, source: list[int], target: list[int]) -> tuple:
        """(logits, presents) of PyTorch fp32; the noise against its float64 twin recorded."""
        ids = torch.tensor([target])
        with torch.no_grad():
            logits, presents = self.inp.model.decode(ids, self._cross(source))
            logits64, presents64 = self.model64.decode(ids, self._cross(source, fp64=True))
        self.noise.record("logits", logits[0], logits64[0])
        for (k, v), (k64, v64) in zip(presents, presents64):
            self.noise.record("present", k, k64)
            self.noise.record("present", v, v64)
        return logits, presents

    def _logits(self, source: list[int], target: list[int]) -> np.ndarray:
        return self._decode(source, target)[0][0].float().numpy()

    def _diff(self, got: np.ndarray, want: np.ndarray, atol: float) -> tuple[float, bool]:
        if got.shape != want.shape:
            return float("inf"), False
        if not (np.isfinite(got).all() and np.isfinite(want).all()):
            return float("nan"), False
        d = np.abs(got.astype(np.float64) - want.astype(np.float64))
        return float(d.max()) if d.size else 0.0, bool((d <= atol + self.inp.rtol * np.abs(want)).all())

    def _check(self, name: str, pairs: list[tuple[str, np.ndarray, np.ndarray]], res: VariantResult,
               detail: str = "") -> None:
        """Judges the pairs (label "output[where]", graph, PyTorch), each output within the atol its noise on
        this check's inputs gives (export/parity_noise.py)."""
        worst, worst_label, ok = 0.0, "", True
        atols = self.noise.atols()
        for label, got, want in pairs:
            output = label.split("[")[0]
            d, good = self._diff(got, want, self.noise.atol(atols, output))
            res.max_abs_diff[output] = max(res.max_abs_diff.get(output, 0.0), d)
            if not good and ok or (good == ok and not d <= worst):   # the first breach, else the largest
                worst, worst_label = d, label
            ok &= good
        # worst_output names the output (the failure table marks that row); detail says where exactly.
        res.checks.append(Check(name, ok, max_abs_diff=worst, worst_output=worst_label.split("[")[0] or None,
                                detail=f"worst: {worst_label}" + (f"; {detail}" if detail else ""),
                                tolerance=atols or None, noise=dict(self.noise.last) or None))

    # -- the checks
    def encoder(self, drv: SlotDriver, res: VariantResult) -> None:
        sources = [self._source(n, 31 * r) for r, n in enumerate(SOURCE_LENGTHS)]
        outs = drv.encode(0, sources)
        pairs = []
        for r, s in enumerate(sources):
            for i, (k, v) in enumerate(self._cross(s)):
                for kind, ref in (("key", k), ("value", v)):
                    got = outs[cross_name(i, kind)][r, :, :len(s)]
                    pairs.append((f"{cross_name(i, kind)}[row {r}]", got[..., self.channels], ref[0].numpy()))
                    if self.padding:
                        pad = got[..., self.padding]
                        pairs.append(("cross padding channels", pad, np.zeros_like(pad)))
        self._check(f"encoder: sources of {'/'.join(str(len(s)) for s in sources)} tokens in one call", pairs, res)
        self.sources = sources

    def ragged_and_reuse(self, drv: SlotDriver, res: VariantResult) -> None:
        sources = self.sources
        targets = [self._target(n) for n in TARGET_LENGTHS]
        logits = drv.first(0, targets)
        pairs = [(f"logits[first call row {r}]", logits[r, :len(t)], self._logits(s, t))
                 for r, (s, t) in enumerate(zip(sources, targets))]
        for step in range(STEPS):
            nxt = self._random_ids(len(targets))
            for t, tok in zip(targets, nxt):
                t.append(tok)
            got = drv.step(nxt, [len(t) for t in targets])
            pairs += [(f"logits[step {step} row {r}]", got[r], self._logits(s, t)[-1])
                      for r, (s, t) in enumerate(zip(sources, targets))]
        self._check(f"decoder: targets of {'/'.join(map(str, TARGET_LENGTHS))} in one first call, then "
                    f"{STEPS} steps together", pairs, res)
        # Slot 1 gets a new request (another source length; its cross slot keeps the old values beyond it).
        new_source = self._source(REUSE_SOURCE, 97)
        drv.encode(1, [new_source])
        sources = [sources[0], new_source, sources[2]]
        targets[1] = self._target(REUSE_PREFIX)
        got = drv.run(1, np.array([targets[1]]), np.array([REUSE_PREFIX]))[0]
        pairs = [("logits[reused slot first call]", got, self._logits(new_source, targets[1]))]
        for step in range(3):
            nxt = self._random_ids(len(targets))
            for t, tok in zip(targets, nxt):
                t.append(tok)
            got = drv.step(nxt, [len(t) for t in targets])
            pairs += [(f"logits[reuse step {step} row {r}]", got[r], self._logits(s, t)[-1])
                      for r, (s, t) in enumerate(zip(sources, targets))]
        cache = [("present[reused slot]", drv.cache[past_name(i, k)][1, :, :len(targets[1])][..., self.channels],
                  ref) for i, kind_refs in enumerate(self._self_cache(new_source, targets[1]))
                 for k, ref in zip(("key", "value"), kind_refs)]
        self._check("slot reused by a new source while the others decode", pairs + cache, res)

    def _self_cache(self, source: list[int], target: list[int]) -> list[tuple[np.ndarray, np.ndarray]]:
        _, presents = self._decode(source, target)
        return [(k[0].numpy(), v[0].numpy()) for k, v in presents]

    def greedy(self, enc: ort.InferenceSession, dec: ort.InferenceSession, res: VariantResult) -> None:
        from training.seq2seq import generate_greedy

        inp = self.inp
        n_new = min(GREEDY_TOKENS, inp.max_target_length - 1)
        sources = [self._source(3 + 2 * r, 13 * r + 5) for r in range(GREEDY_SOURCES)]
        drv = SlotDriver(enc, dec, inp, len(sources))
        drv.encode(0, sources)
        got = graph_greedy(drv, len(sources), n_new)
        want = []
        for s in sources:
            with torch.no_grad():
                want.append(generate_greedy(inp.model, torch.tensor([s]), None, n_new)[0].tolist())
        same = sum(g[:len(w)] == w for g, w in zip(got, want))
        res.checks.append(Check(f"greedy {n_new} tokens of {len(sources)} sources batched identical ids",
                                same == len(sources), value=same / len(sources), threshold=1.0,
                                detail=f"{same}/{len(sources)} rows identical"))

    def transformers_logits(self, drv: SlotDriver, res: VariantResult) -> None:
        """The ragged batch's teacher-forced logits against transformers' own model of the checkpoint."""
        try:
            import transformers
        except ImportError:
            res.checks.append(Check("transformers logits", True, detail="not run: transformers not installed"))
            return
        transformers.utils.logging.disable_progress_bar()   # its weight-loading bar would land in the CLI's stderr
        hf = transformers.AutoModelForSeq2SeqLM.from_pretrained(self.inp.checkpoint,
                                                                  attn_implementation="eager").eval()
        sources = [self._source(n, 31 * r) for r, n in enumerate(SOURCE_LENGTHS)]
        targets = [self._target(n) for n in TARGET_LENGTHS]
        drv.encode(0, sources)
        got = drv.first(0, targets)
        src = torch.full((len(sources), max(map(len, sources))), self.inp.pad)
        tgt = torch.full((len(targets), max(map(len, targets))), self.inp.pad)
        for r, (s, t) in enumerate(zip(sources, targets)):
            src[r, :len(s)], tgt[r, :len(t)] = torch.tensor(s), torch.tensor(t)
        feeds = dict(input_ids=src, attention_mask=(torch.arange(src.shape[1])[None] < torch.tensor(
            [len(s) for s in sources])[:, None]).long(), decoder_input_ids=tgt,
            decoder_attention_mask=(torch.arange(tgt.shape[1])[None] < torch.tensor(
                [len(t) for t in targets])[:, None]).long())
        with torch.no_grad():
            want = hf(**feeds).logits.float().numpy()
            # this check's reference is transformers' model: its own float64 twin gives the noise
            want64 = float64_twin(hf)(**feeds).logits.numpy()
        for r, t in enumerate(targets):
            self.noise.record("logits", want[r, :len(t)], want64[r, :len(t)])
        pairs = [(f"logits[transformers row {r}]", got[r, :len(t)], want[r, :len(t)]) for r, t in enumerate(targets)]
        self._check(f"transformers {type(hf).__name__}: the ragged batch's logits", pairs, res)

    def check(self, encoder_path: Path, decoder_path: Path) -> VariantResult:
        inp = self.inp
        res = VariantResult("fp32", "", {"atol": inp.atol, "rtol": inp.rtol})
        res.noise = self.noise
        enc, dec = session(encoder_path, inp.threads), session(decoder_path, inp.threads)
        drv = SlotDriver(enc, dec, inp, len(SOURCE_LENGTHS))
        self.encoder(drv, res)
        self.ragged_and_reuse(drv, res)
        self.greedy(enc, dec, res)
        if inp.checkpoint is not None:
            self.transformers_logits(SlotDriver(enc, dec, inp, len(SOURCE_LENGTHS)), res)
        res.status = "passed" if all(c.passed for c in res.checks) else "failed"
        log.info("seq2seq parity: %s (%s)", res.status, ", ".join(f"{k} {v:.2e}" for k, v in res.max_abs_diff.items()))
        return res


def graph_greedy(drv: SlotDriver, rows: int, n_new: int) -> list[list[int]]:
    """Greedy decoding of slots 0..rows-1 together (their sources already encoded), generate_greedy's rules:
    forced bos / eos, a finished row feeds pad, stop when every row has produced eos."""
    inp = drv.inp
    tokens = [inp.decoder_start] * rows
    finished = [False] * rows
    out: list[list[int]] = [[] for _ in range(rows)]
    for step in range(n_new):
        logits = drv.step(tokens, [step + 1] * rows)
        nxt = [int(t) for t in logits.argmax(-1)]
        if step == 0 and inp.forced_bos is not None:
            nxt = [inp.forced_bos] * rows
        if step == n_new - 1 and inp.forced_eos is not None:
            nxt = [inp.forced_eos] * rows
        for r in range(rows):
            if finished[r]:
                nxt[r] = inp.pad
            finished[r] = finished[r] or nxt[r] == inp.eos
            out[r].append(nxt[r])
        tokens = nxt
        if all(finished):
            break
    return out


def run_seq2seq_gate(inp: Seq2SeqGateInputs, encoder_path: Path, decoder_path: Path
                     ) -> tuple[bool, dict[str, VariantResult], float]:
    t0 = time.perf_counter()
    before = torch.get_num_threads()
    torch.set_num_threads(max(1, inp.threads))
    try:
        result = Seq2SeqGate(inp).check(encoder_path, decoder_path)
    finally:
        torch.set_num_threads(before)
    return result.passed is True, {"fp32": result}, time.perf_counter() - t0
