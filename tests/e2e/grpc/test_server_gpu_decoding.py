"""Decoding strategies with a CUDA decoder: beam search on decoder-only models and structured outputs, served from
the fp16 in-place graph on CUDA with its cache in GPU memory — where a beam's slot copies are device copies.

Beams: the random GPT-2 and Llama of tests/e2e/grpc/test_decoder_beam_search.py, exported with `--variants
fp32,fp16`; the CUDA server picks fp16. Every served hypothesis is teacher-forced through the same fp16 graph offline
on CUDA (one sequence, its own cache): its served logprobs equal those within fp16's rounding — a slot copied wrong
would hand later steps another hypothesis's cache, and their logprobs would part. Its score (transformers' formula)
is the fp32 transformers `generate(num_beams=4)` best score within that rounding; whether the ids are transformers'
too is printed (fp16 may reorder near ties).

Structured: a JSON schema on a random Qwen2 served the same way: every seed's answer parses and validates.

Skips (with the reason) where onnxruntime has no CUDAExecutionProvider, e.g. the CPU wheel."""
from __future__ import annotations

import json
import logging
from pathlib import Path

import jsonschema
import numpy as np
import onnxruntime as ort
import pytest
from tests.cuda import CUDA, NEEDS_CUDA
from tests.decoder_beams import NEW, beam_score, hf_decoder, transformers_beams
from tests.hf_decoder_export import export_hf_decoders
from tests.server_process import ServerProcess

pytestmark = NEEDS_CUDA
PROMPTS = ["ROMEO. What light through yonder window breaks", "To be"]
KINDS = ("gpt2", "llama")
SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"},
                                           "n": {"type": "integer", "minimum": 0, "maximum": 99}},
          "required": ["ok", "n"], "additionalProperties": False}
# fp16 weights and cache against fp32 references: a token's logprob moves within ~1e-2 (as in
# test_server_gpu_families.py); a length-normalised score, the mean of them, by no more.
FP16_LOGPROB_ATOL = 2e-2


@pytest.fixture(scope="module")
def served(tiny_checkpoints, tmp_path_factory: pytest.TempPathFactory):
    from tokenizers import Tokenizer

    from tests.structured_models import hf_qwen2

    logging.getLogger("transformers").setLevel(logging.ERROR)
    tok_dir = tiny_checkpoints.gpt
    tok = Tokenizer.from_file(str(tok_dir / "tokenizer.json"))
    vocab, eot = tok.get_vocab_size(), tok.token_to_id("<|endoftext|>")
    models = {k: hf_decoder(k, vocab, eot) for k in KINDS}
    root = tmp_path_factory.mktemp("gpu-decoding")
    repo = export_hf_decoders({**models, "qwen2": hf_qwen2(tok_dir)}, tok_dir, root, variants="fp32,fp16")
    with ServerProcess(repo, ["--providers", f"{CUDA},CPUExecutionProvider", "--max-sequences", "8",
                              "--prefill-chunk-tokens", "4"], startup_timeout=300) as proc:
        yield proc, repo, models, tok


def _log_softmax(rows: np.ndarray) -> np.ndarray:
    rows = rows.astype(np.float64) - rows.max(axis=-1, keepdims=True)
    return rows - np.log(np.exp(rows).sum(axis=-1, keepdims=True))


@pytest.mark.parametrize("kind", KINDS)
def test_fp16_beams_on_cuda_score_as_transformers_and_as_their_own_graph_offline(served, kind: str) -> None:
    from clients import OrtserveClient
    from testing.offline import greedy_inplace

    proc, repo, models, tok = served
    package = repo / kind / "1"
    manifest = json.loads((package / "model.json").read_text())
    offline = ort.InferenceSession(str(package / manifest["variants"]["fp16"]), providers=[CUDA])
    with OrtserveClient(proc.address, timeout=120) as client:
        info = client.model_info(kind)
        assert (info.providers[0], info.variant) == (CUDA, "fp16"), kind
        answers = [client.generate(p, kind, max_new_tokens=NEW, num_beams=4, logprobs=True) for p in PROMPTS]
    assert "on cuda" in proc.output(last=800)
    for prompt, answer in zip(PROMPTS, answers, strict=True):
        ids, logprobs = [t.token_id for t in answer.tokens], [t.logprob for t in answer.tokens]
        steps: list[np.ndarray] = []
        greedy_inplace(offline, manifest, tok.encode(prompt).ids, len(ids), stop_at_eos=False,
                       step_logits=steps, forced=ids)
        forced = _log_softmax(np.stack(steps))[np.arange(len(ids)), ids]
        (want_ids, want_score), = transformers_beams(models[kind], tok.encode(prompt).ids, 1)
        print(f"{kind} {prompt[:12]!r}: served fp16 beam vs its graph offline: largest logprob difference "
              f"{np.abs(forced - logprobs).max():.2e}; score {beam_score(logprobs):.5f} vs transformers fp32 "
              f"{want_score:.5f}; ids {'equal' if ids == want_ids else 'differ'}")
        np.testing.assert_allclose(logprobs, forced, atol=FP16_LOGPROB_ATOL)
        assert beam_score(logprobs) == pytest.approx(want_score, abs=FP16_LOGPROB_ATOL)


def test_json_schema_answers_on_cuda_parse_and_validate(served) -> None:
    import grpc

    from protos import ortserve_pb2 as pb
    from protos import ortserve_pb2_grpc as pb_grpc

    texts = set()
    with grpc.insecure_channel(served[0].address) as channel:
        tasks = pb_grpc.TaskServiceStub(channel)
        assert tasks.ModelInfo(pb.ModelInfoRequest(model="qwen2")).variant == "fp16"
        for seed in range(6):
            answer = tasks.Generate(pb.GenerateRequest(
                model="qwen2", prompt="Answer:", constraint=pb.OutputConstraint(json_schema=json.dumps(SCHEMA)),
                parameters=pb.GenerationParameters(max_new_tokens=60, temperature=1.0, seed=seed)), timeout=120)
            assert answer.finish_reason == pb.FINISH_REASON_EOS, answer.text
            jsonschema.validate(json.loads(answer.text), SCHEMA)
            texts.add(answer.text)
    assert len(texts) > 1
