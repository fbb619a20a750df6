"""What the server may open of a package, in ONE place: the files one variant reads, and which variants passed.

    served_files      every file the server opens for a variant of the package (parity.json itself aside: it is the
                      list the others are checked against); the loader refuses the version unless each is listed in
                      parity.json `files` with a matching sha256 (server/repository/package.py verify_files)
    refused_variants  the variants whose own parity verdict (parity.json `variants.<name>`) did not pass, with
                      why; choose_variant (server/sessions.py) never picks one

The files, by who opens them (grep for open / InferenceSession / Tokenizer.from_file under server/):
model.json (package.py), the variant's graph (sessions.py create_session), a decoder's mixed graph of that variant
(generation/decoder_model.py), an encoder-decoder's encoder graph and target tokenizer (generation/seq2seq_model.py),
the external data any of those graphs names (onnxruntime, beside the graph: repository/external_data.py),
tokenizer.json (text/tokenizer.py, via the typed models), tokenizer_config.json when the package has one
(repository/consistency.py), the probe when parity.json names one (repository/probe.py). The beam-score graph is built into the server (generation/beam_scores.py) and the
chat template is read from model.json: neither is a file of the package.
"""
from __future__ import annotations

from typing import Any

from modelpkg import MANIFEST_FILE, TOKENIZER_FILE

from server.repository.external_data import external_data_files
from server.repository.package import Package
from server.repository.probe import probe_file

TOKENIZER_CONFIG_FILE = "tokenizer_config.json"


def served_files(package: Package, variant: str) -> list[str]:
    """The package's files the server opens to serve `variant`, each once, in the order it opens them."""
    manifest = package.manifest
    graphs = [manifest.variant_file(variant)]
    mixed = manifest.cache.mixed_graph(variant) if manifest.cache is not None else None
    if mixed is not None and manifest.encoder_decoder is None:   # an encoder-decoder runs no mixed graph
        graphs.append(mixed)
    block = manifest.encoder_decoder
    if block is not None:
        graphs.append(block.encoder_file(variant))
    files = [MANIFEST_FILE]
    for graph in graphs:     # each graph, then the external data onnxruntime would open beside it
        files += [graph, *external_data_files(package.file(graph))]
    if block is not None and block.target_tokenizer:
        files.append(block.target_tokenizer)
    files.append(TOKENIZER_FILE)
    if package.file(TOKENIZER_CONFIG_FILE).exists():    # optional: read (and so verified) whenever it is there
        files.append(TOKENIZER_CONFIG_FILE)
    probe = probe_file(package)
    if probe is not None:                               # the variant is checked on this CPU (repository/probe.py)
        files.append(probe)
    return list(dict.fromkeys(files))


def refused_variants(package: Package) -> dict[str, str]:
    """Variant of model.json -> why it may not serve: its own verdict in parity.json is missing or did not pass
    (`passed` true and, when recorded, `status` "passed"); a top-level `passed` does not speak for a variant."""
    verdicts: Any = package.parity.get("variants")
    refused = {}
    for variant in package.manifest.variants:
        verdict = verdicts.get(variant) if isinstance(verdicts, dict) else None
        if not isinstance(verdict, dict):
            refused[variant] = "parity.json has no verdict for it"
        elif verdict.get("passed") is not True or verdict.get("status", "passed") != "passed":
            refused[variant] = f"its parity verdict is {str(verdict.get('status') or 'not passed')!r}"
    return refused
