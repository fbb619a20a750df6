"""The house rules of docs/ARCHITECTURE.md, read from the code: which folder may import which, the server root kept
small, and product modules and functions of a readable size. A change that breaks one fails here, naming the file."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("server", "training", "export", "clients", "modelpkg", "pipeline", "protos")
OURS = (*PRODUCT, "bench", "testing", "tests", "scripts")

# Folder -> the folders of ours it may import (a folder always imports itself). Mirrors the table in
# docs/ARCHITECTURE.md ("Who may import what"); the server's parts are named one level down.
SERVER_BELOW_THE_DOORS = {"protos", "server.admission", "server.model", "server.sessions", "server.encoders",
                          "server.generation", "server.repository", "server.runtime", "server.protocol", "server.text",
                          "server.structured"}
ALLOWED: dict[str, set[str]] = {
    "modelpkg": set(),
    "protos": set(),
    "training": set(),
    "export": {"training", "modelpkg"},
    "pipeline": {"clients", "modelpkg", "protos", "training"},
    "clients": {"protos"},
    "server.protocol": {"protos", "modelpkg", "server.dataplane", "server.encoders", "server.generation"},
    "server.text": {"protos", "server.protocol"},
    "server.structured": set(),    # constraints and tool calls: llguidance, numpy, nothing of ours
    "server.runtime": {"server.admission", "server.generation", "server.protocol"},
    "server.admission": {"server.protocol", "server.repository"},
    "server.sessions": {"modelpkg", "server.protocol", "server.repository", "server.runtime"},
    "server.model": {"modelpkg", *SERVER_BELOW_THE_DOORS},
    "server.encoders": {"modelpkg", *SERVER_BELOW_THE_DOORS},
    "server.generation": {"modelpkg", *SERVER_BELOW_THE_DOORS},
    "server.repository": {"modelpkg", *SERVER_BELOW_THE_DOORS},
    "server.dataplane": {"modelpkg", "server.leases", "server.runtime_config", *SERVER_BELOW_THE_DOORS},
    "server.leases": {"modelpkg", *SERVER_BELOW_THE_DOORS},
    "server.runtime_config": {"modelpkg", *SERVER_BELOW_THE_DOORS},
    "server.grpc": {"protos", "server", "server.dataplane", "server.protocol", "server.runtime", "server.generation",
                    "server.text", "server.encoders", "server.structured"},
    "server.http": {"server", "server.dataplane", "server.protocol", "server.runtime", "server.generation",
                    "server.text", "server.encoders", "server.structured"},
    "server.ray": {"protos", "server.dataplane", "server.grpc", "server.http", "server.runtime", "server.protocol"},
    "server.process": {"server.dataplane", "server.grpc", "server.http", "server.runtime"},
    "server.__main__": {"server.process", "server.runtime", "server.sessions"},
    "server": set(),   # server/__init__.py: the version string only
}
# The one file of clients that runs the data plane in-process (the batch script's --local): it may reach the
# data plane and what its calls take and return, nothing below.
EXCEPTIONS = {Path("clients/batch/local.py"): {"server.dataplane", "server.generation", "server.protocol",
                                               "server.runtime", "server.runtime_config"}}
# What the doors may take from server.encoders / server.generation: result types and their wire forms, never a
# served model or the engine.
DOOR_MODULES_FORBIDDEN = ("server.generation.engine", "server.generation.decoder_model",
                          "server.generation.seq2seq_model", "server.encoders.encoder", "server.encoders.batching")
MAX_MODULE_LINES, MAX_FUNCTION_LINES, MAX_SERVER_ROOT_MODULES = 450, 100, 12


def _unit(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "server" else parts[0]


def _module_name(path: Path) -> str:
    dotted = ".".join(path.relative_to(ROOT).with_suffix("").parts)
    return dotted.removesuffix(".__init__")


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return {m for m in found if m.split(".")[0] in OURS}


def _sources(*folders: str) -> list[Path]:
    return sorted(p for f in folders for p in (ROOT / f).rglob("*.py") if "_pb2" not in p.name)


def test_every_folder_imports_only_what_the_map_allows() -> None:
    checked = 0
    for path in _sources(*PRODUCT):
        me = _unit(_module_name(path))
        assert me in ALLOWED, f"{path.relative_to(ROOT)}: {me} is not in the map (docs/ARCHITECTURE.md)"
        allowed = ALLOWED[me] | EXCEPTIONS.get(path.relative_to(ROOT), set()) | {me}
        wrong = sorted(m for m in _imports(path) if _unit(m) not in allowed)
        assert not wrong, f"{path.relative_to(ROOT)} imports {wrong}; {me} may import {sorted(allowed - {me})}"
        checked += 1
    assert checked > 200, checked   # the scan sees the project


def test_the_doors_never_reach_a_served_model_or_the_engine() -> None:
    doors = _sources("server/grpc", "server/http", "server/ray") + [ROOT / "server/protocol/kserve.py"]
    for path in doors:
        reached = sorted(m for m in _imports(path) if m.startswith(DOOR_MODULES_FORBIDDEN))
        assert not reached, f"{path.relative_to(ROOT)} imports {reached}"


def test_the_server_root_stays_small() -> None:
    modules = sorted(p.name for p in (ROOT / "server").glob("*.py"))
    assert len(modules) <= MAX_SERVER_ROOT_MODULES, modules


@pytest.mark.parametrize("folder", ["server", "training", "export"])
def test_modules_and_functions_stay_readable(folder: str) -> None:
    for path in _sources(folder):
        text = path.read_text()
        lines = text.count("\n")
        assert lines <= MAX_MODULE_LINES, f"{path.relative_to(ROOT)}: {lines} lines (at most {MAX_MODULE_LINES})"
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                assert length <= MAX_FUNCTION_LINES, f"{path.relative_to(ROOT)}:{node.lineno} {node.name}: {length} lines"
