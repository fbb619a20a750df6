"""Chinese end to end, as the README shows it: the user's own text (tests/data/tang_poems.txt, classical poems) and
labelled passages (五言 / 七言 verse lines) go through the pipeline with `--encoder scratch` — WordPiece and
byte-level BPE tokenizers trained on the text, MLM, classifier and decoder training (tiny models), export through
the parity gate — into a real server: fill-mask predicts a CJK character and reads without spaces, and streamed
generation sends whole characters only, even where one character is several byte-level tokens."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from clients import OrtserveClient
from tests.server_process import ROOT, ServerProcess

DATA = ROOT / "tests" / "data"
NAMES = {"classify": "zh-form", "fill-mask": "zh-fill-mask", "generate": "zh-gpt"}


def _is_cjk(ch: str) -> bool:
    return "\u4e00" <= ch <= "\u9fff" or "\u3000" <= ch <= "\u303f" or "\uff00" <= ch <= "\uffef"


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("zh")
    repo = d / "repository"
    cmd = [sys.executable, "-m", "pipeline", "--workdir", str(d / "work"), "--repository", str(repo),
           "--encoder", "scratch", "--corpus", str(DATA / "tang_poems.txt"), "--preset", "tiny",
           "--classify-data", *(str(DATA / f"tang_poems_{s}.jsonl") for s in ("train", "validation", "test")),
           "--steps", "mlm=80", "--steps", "classify=30", "--steps", "lm=200", "--threads", "1", "--quiet",
           "--variants", "classify=fp32", "--variants", "fill-mask=fp32",
           *(arg for task, name in NAMES.items() for arg in ("--name", f"{task}={name}"))]
    run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    assert json.loads(run.stdout.strip().splitlines()[-1])["published"] == {name: 1 for name in NAMES.values()}
    return repo


@pytest.fixture(scope="module")
def client(repository: Path):  # type: ignore[no-untyped-def]
    # One decode step per iteration, so a stream's chunks are one token each: the streaming test below looks
    # for a chunk that held back a token that is no whole character alone.
    server = ServerProcess(repository, ["--decode-steps", "1"])
    try:
        with OrtserveClient(server.address, timeout=60) as c:
            yield c
    finally:
        server.stop()


def test_tokenizers_split_cjk_per_character_and_into_bytes(repository: Path) -> None:
    wordpiece = Tokenizer.from_file(str(repository / NAMES["fill-mask"] / "1" / "tokenizer.json"))
    enc = wordpiece.encode("床前明月光，疑是地上霜。")
    assert enc.tokens[1:-1] == list("床前明月光，疑是地上霜。")  # one token per character, [CLS] ... [SEP]
    assert wordpiece.decode(enc.ids) == "床前明月光，疑是地上霜。"     # and no spaces between them when decoded
    bpe = Tokenizer.from_file(str(repository / NAMES["generate"] / "1" / "tokenizer.json"))
    rare = "蒌蒿"  # each once in the corpus: below the BPE's min_frequency, so left as UTF-8 bytes
    ids = bpe.encode(rare).ids
    assert len(ids) > len(rare) and bpe.decode(ids) == rare


def test_fill_mask_predicts_cjk_characters(client: OrtserveClient) -> None:
    text = "床前明月光，疑是地上[MASK]。"
    [result] = client.fill_mask(text, NAMES["fill-mask"], top_k=5)
    [mask] = result.masks
    assert len(mask.candidates) == 5 and _is_cjk(mask.candidates[0].token), mask.candidates
    for cand in mask.candidates:
        assert len(cand.token) == 1, cand  # a character, never a piece of one
        assert cand.sequence == text.replace("[MASK]", cand.token)  # decoded without spaces between characters


def test_classifier_answers_with_the_users_labels(client: OrtserveClient) -> None:
    out = client.classify(["白日依山尽，黄河入海流。", "两岸猿声啼不住，轻舟已过万重山。"], NAMES["classify"], top_k=2)
    assert all(c.label in ("五言", "七言") for c in out)
    assert all({s.label for s in c.scores} == {"五言", "七言"} for c in out)


def test_streamed_generation_sends_whole_characters(client: OrtserveClient, repository: Path) -> None:
    bpe = Tokenizer.from_file(str(repository / NAMES["generate"] / "1" / "tokenizer.json"))
    held_back = 0
    for seed in range(6):  # sampled text reaches the rare characters that are several byte-level tokens
        params = dict(max_new_tokens=64, temperature=1.0, seed=seed, ignore_eos=True)
        chunks = list(client.generate_stream("床前明月光，", NAMES["generate"], **params))
        ids = [t.token_id for c in chunks for t in c.tokens]
        text = "".join(c.text for c in chunks)
        # The streamed text is the decoding of all generated tokens at once: no chunk boundary cut a character
        # (a cut one would show as U+FFFD pieces in the stream, not in the whole decoding). With ignore_eos the
        # special tokens' text is part of the output (docs/protocol.md, "Tokens beside the text").
        assert text == bpe.decode(ids, skip_special_tokens=False)
        assert sum(_is_cjk(ch) for ch in text) > len(text) / 2, text
        assert client.generate("床前明月光，", NAMES["generate"], **params).text == text
        # A token whose bytes are no whole character alone was held back (its chunk has no text) and the
        # character went out whole with a later token.
        held_back += sum(1 for c in chunks if c.text == "" and "\ufffd" in bpe.decode([c.tokens[0].token_id]))
    assert held_back > 0, "no generated character spanned several tokens: nothing was tested"
