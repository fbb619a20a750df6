"""What bench/seq2seq.py measures on: two checkpoints, ortserve's packages and CTranslate2's conversions of them,
and the sources fed to every side.

  g2p     the default grapheme-to-phoneme model (artifacts/checkpoints/g2p, trained by `python -m training g2p`
          when absent, ~5 minutes on 2 quiet cores); sources: CMUdict held-out words (training/cmudict.py's fixed
          test split), a seeded sample; outputs end at eos as the model decides
  marian  an OPUS-MT-shaped MarianMTModel (6+6 layers, 512 wide, 8 heads, FFN 2048, swish, vocab 58101 with
          pad = 58100 last and eos 0, sqrt(d) embeddings, tied head) built by `transformers` from a MarianConfig with
          random weights (seed 0); a word-level tokenizer (w2 .. w58099); sources: 8-24 words drawn from a fixed
          sample of 2,000 of them. Random weights never choose eos sensibly, so every side generates exactly
          `max_new` tokens (eos suppressed until then)

Each is exported with `python -m export --variants w8,int8` (parity gate included: fp32 and ortserve's two 8-bit
variants, the counterparts of CTranslate2's int8: w8's MatMulNBits weights and int8's per-token integer products) and
converted with CTranslate2's converter (float32 and int8). A stamp of the checkpoint's weights file makes a retrained
checkpoint re-export and re-convert; a digest of the exporter's source makes a changed exporter re-export.
"""
from __future__ import annotations

import hashlib
import json
import logging
import random
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from .s2s_peer import conversion

log = logging.getLogger(__name__)
HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
CT2_VENV = HERE / ".venv-ct2"
G2P_CHECKPOINT = ROOT / "artifacts" / "checkpoints" / "g2p"

MARIAN_SHAPE = dict(vocab_size=58101, d_model=512, encoder_layers=6, decoder_layers=6, encoder_attention_heads=8,
                    decoder_attention_heads=8, encoder_ffn_dim=2048, decoder_ffn_dim=2048, activation_function="swish",
                    scale_embedding=True, max_position_embeddings=512, pad_token_id=58100, eos_token_id=0,
                    decoder_start_token_id=58100, forced_eos_token_id=None, share_encoder_decoder_embeddings=True,
                    tie_word_embeddings=True)
MARIAN_SOURCE_WORDS = (8, 24)       # words per synthetic source (+ eos)
MARIAN_MAX_SOURCE = 32
STEP_LENGTH = 256                   # the step piece's longer target position: the self cache must hold it
MARIAN_MAX_TARGET = 288
VARIANTS = ["--variants", "w8,int8"]   # the 8-bit counterparts of CTranslate2's int8 (export/seq2seq_quantized.py)


class MaterialError(RuntimeError):
    """Something the benchmark needs could not be made (the message says what to run)."""


@dataclass(frozen=True)
class Model:
    """One benchmarked model: its checkpoint, ortserve package, CTranslate2 conversions and how to feed it."""

    name: str                          # "g2p" | "marian"
    checkpoint: Path
    package: Path                      # <repo>/<name>/1, the model alone in its repository
    ct2: dict[str, Path]               # "float32" | "int8" -> CTranslate2 model directory
    ct2_conversion: str                # how the converter was run (bench/s2s_peer.py conversion())
    eos_id: int
    fixed_length: bool                 # True: every side generates exactly max_new tokens (random weights)

    @property
    def repository(self) -> Path:
        return self.package.parent.parent


def g2p_checkpoint(explicit: Path | None) -> Path:
    """The g2p checkpoint: --checkpoint, else artifacts/checkpoints/g2p, trained now (default preset) if absent."""
    if explicit is not None:
        if not (explicit / "config.json").is_file():
            raise MaterialError(f"--checkpoint: {explicit} is not a checkpoint directory (no config.json)")
        return explicit
    if not (G2P_CHECKPOINT / "config.json").is_file():
        log.info("no g2p checkpoint at %s: training it (python -m training g2p, default preset, ~5 min)",
                 G2P_CHECKPOINT)
        done = subprocess.run([sys.executable, "-m", "training", "g2p"], cwd=ROOT)
        if done.returncode != 0 or not (G2P_CHECKPOINT / "config.json").is_file():
            raise MaterialError(f"python -m training g2p failed (exit {done.returncode}): pass --checkpoint DIR")
    return G2P_CHECKPOINT


def marian_checkpoint(work: Path) -> Path:
    """The random OPUS-MT-shaped checkpoint (written once; ~300 MB)."""
    out = work / "marian-opus-mt-shape-random"
    if (out / "config.json").is_file() and (out / "tokenizer.json").is_file():
        return out
    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    model = transformers.MarianMTModel(transformers.MarianConfig(**MARIAN_SHAPE)).eval()
    tmp = out.with_name(f".{out.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    word_tokenizer(MARIAN_SHAPE["vocab_size"]).save(str(tmp / "tokenizer.json"))
    (tmp / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "pad_token": "<pad>", "eos_token": "</s>", "unk_token": "<unk>",
        "model_max_length": MARIAN_MAX_SOURCE}))
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def word_tokenizer(vocab_size: int):
    """OPUS-MT's layout of specials (</s> 0, <unk> 1, <pad> last) around words w2 .. w{vocab-2}; `</s>` appended."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    vocab = {"</s>": 0, "<unk>": 1, **{f"w{i}": i for i in range(2, vocab_size - 1)}, "<pad>": vocab_size - 1}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 0)])
    tok.add_special_tokens(["</s>", "<unk>", "<pad>"])
    return tok


def g2p_sources(n: int, seed: int = 0) -> list[str]:
    """n CMUdict held-out (test split) words, a seeded sample in a fixed order."""
    from training.cmudict import load_lexicon

    words = [w for w, _ in load_lexicon().splits["test"]]
    if n > len(words):
        raise MaterialError(f"g2p: {n} sources asked, the held-out split has {len(words)} words")
    return random.Random(seed).sample(words, n)


def marian_sources(n: int, seed: int = 0) -> list[str]:
    """n synthetic sources of 8-24 words from a fixed sample of 2,000 words of the vocabulary."""
    rng = random.Random(seed)
    sample = rng.sample(range(2, MARIAN_SHAPE["vocab_size"] - 1), 2000)
    lo, hi = MARIAN_SOURCE_WORDS
    return [" ".join(f"w{rng.choice(sample)}" for _ in range(rng.randint(lo, hi))) for _ in range(n)]


def _stamp(checkpoint: Path) -> dict[str, object]:
    weights = next((checkpoint / f for f in ("model.safetensors", "pytorch_model.bin")
                    if (checkpoint / f).is_file()), None)
    if weights is None:
        raise MaterialError(f"{checkpoint}: no model.safetensors")
    st = weights.stat()
    return {"checkpoint": str(checkpoint.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def _fresh(marker: Path, stamp: dict[str, object]) -> bool:
    return marker.is_file() and json.loads(marker.read_text()) == stamp


def _exporter_digest() -> str:
    """A digest of the exporter's and the package format's source: a package made by other code is made again."""
    h = hashlib.sha256()
    for path in sorted([*(ROOT / "export").glob("*.py"), *(ROOT / "modelpkg").glob("*.py")]):
        h.update(path.name.encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:16]


def export_package(checkpoint: Path, repo: Path, name: str, threads: int, extra: list[str]) -> Path:
    """ortserve's package (python -m export, gate included), unless one of the same weights, made by the same
    exporter code, is there."""
    pkg = repo / name / "1"
    marker = repo / f".{name}.source.json"
    stamp = {**_stamp(checkpoint), "args": extra, "exporter": _exporter_digest()}
    if (pkg / "parity.json").is_file() and _fresh(marker, stamp):
        return pkg
    shutil.rmtree(repo / name, ignore_errors=True)
    cmd = [sys.executable, "-m", "export", str(checkpoint), "--task", "generate", "--repository", str(repo),
           "--name", name, "--version", "1", "--threads", str(threads), *extra]
    log.info("exporting %s: %s", name, " ".join(cmd[1:]))
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise MaterialError(f"python -m export {checkpoint} failed (exit {done.returncode}): {tail}")
    marker.write_text(json.dumps(stamp))
    return pkg


def convert_ct2(checkpoint: Path, out: Path, quantization: str) -> Path:
    """CTranslate2's conversion of the checkpoint (bench/s2s_peer.py convert), unless one of the same weights is
    there."""
    py = CT2_VENV / "bin" / "python"
    if not (CT2_VENV / ".complete").is_file():
        raise MaterialError("CTranslate2 peer not installed: run bash bench/setup_ct2.sh")
    marker = out.with_name(f".{out.name}.source.json")
    stamp = _stamp(checkpoint)
    if (out / "model.bin").is_file() and _fresh(marker, stamp):
        return out
    cmd = [str(py), "-m", "bench.s2s_peer", "convert", str(checkpoint), str(out)]
    if quantization != "float32":
        cmd += ["--quantization", quantization]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=peer_env())
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise MaterialError(f"CTranslate2 conversion of {checkpoint} ({quantization}) failed: {tail}")
    log.info("converted %s for CTranslate2 (%s): %s", checkpoint.name, quantization,
             json.loads(done.stdout.strip().splitlines()[-1])["loader"])
    marker.write_text(json.dumps(stamp))
    return out


def peer_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a peer process: this one's without the benchmark's own OpenMP settings (bench/openmp.py:
    CTranslate2 and torch set their threads themselves), with the repository importable."""
    from .openmp import peer_environ

    env = {k: v for k, v in peer_environ().items() if k != "PYTHONPATH"}
    return {**env, "PYTHONPATH": str(ROOT), **(extra or {})}


def build(work: Path, which: tuple[str, ...], g2p: Path | None, threads: int) -> dict[str, Model]:
    """Every model of `which`, made or reused under `work`."""
    models: dict[str, Model] = {}
    for name in which:
        if name == "g2p":
            ckpt = g2p_checkpoint(g2p)
            pkg = export_package(ckpt, work / "repo-g2p", "g2p", threads, VARIANTS)
            fixed = False
        else:
            ckpt = marian_checkpoint(work)
            sizes = ["--max-source-length", str(MARIAN_MAX_SOURCE), "--max-target-length", str(MARIAN_MAX_TARGET)]
            pkg = export_package(ckpt, work / "repo-marian", "marian", threads, [*sizes, *VARIANTS])
            fixed = True
        ct2 = {q: convert_ct2(ckpt, work / "ct2" / f"{name}-{q}", q) for q in ("float32", "int8")}
        config = json.loads((ckpt / "config.json").read_text())
        models[name] = Model(name, ckpt, pkg, ct2, conversion(config), config["eos_token_id"], fixed)
    return models
