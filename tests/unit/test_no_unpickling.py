"""No Python source of the project unpickles: pickle.load(s), torch.load without weights_only=True,
np.load(allow_pickle=True) and friends are refused by an AST scan (which is itself tested).
"""
from __future__ import annotations

import ast
import os
from pathlib import Path
from typing import Iterator

from tests.server_process import ROOT

SKIP_DIRS = {".git", "__pycache__", "build", "dist", "node_modules"}


def python_sources(root: Path) -> Iterator[Path]:
    """The project's Python files: everything under root but virtual environments and hidden/build dirs."""
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS and not d.startswith(".")
                       and not (here / d / "pyvenv.cfg").exists() and not d.endswith(".egg-info")]
        yield from (here / f for f in filenames if f.endswith(".py"))


_PICKLE_MODULES = {"pickle", "cPickle", "_pickle", "dill", "cloudpickle", "joblib", "shelve", "marshal"}
_PICKLE_FUNCTIONS = {"load", "loads", "Unpickler", "open"}  # shelve.open unpickles too


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return ""


def _keyword_is(call: ast.Call, name: str, value: object) -> bool:
    return any(k.arg == name and isinstance(k.value, ast.Constant) and k.value.value is value for k in call.keywords)


def unpickling_calls(source: str, filename: str = "<source>") -> list[str]:
    """'file:line: what' for every call in `source` that can unpickle."""
    tree = ast.parse(source, filename)
    aliases: dict[str, str] = {}  # local name -> module.function it stands for
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            for a in node.names:
                aliases[a.asname or a.name] = f"{node.module}.{a.name}"
        elif isinstance(node, ast.Import):
            for a in node.names:
                aliases[a.asname or a.name] = a.name
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = _dotted(node.func)
        head, _, rest = name.partition(".")
        full = f"{aliases.get(head, head)}.{rest}" if rest else aliases.get(name, name)
        module, _, function = full.rpartition(".")
        root = module.split(".")[0]
        where = f"{filename}:{node.lineno}: {name}"
        if root in _PICKLE_MODULES and function in _PICKLE_FUNCTIONS:
            found.append(f"{where} unpickles")
        elif full in ("pandas.read_pickle", "numpy.lib.format.read_array"):
            found.append(f"{where} unpickles")
        elif full == "torch.load" and not _keyword_is(node, "weights_only", True):
            found.append(f"{where} without weights_only=True")
        elif full in ("numpy.load", "np.load") and any(k.arg == "allow_pickle" and not (
                isinstance(k.value, ast.Constant) and k.value.value is False) for k in node.keywords):
            found.append(f"{where} with allow_pickle")
    return found


def test_no_source_unpickles() -> None:
    sources = list(python_sources(ROOT))
    assert len(sources) > 50 and ROOT / "server" / "dataplane.py" in sources  # the scan sees the project
    assert not any("site-packages" in str(p) for p in sources)
    findings = [f for p in sources for f in unpickling_calls(p.read_text(encoding="utf-8"), str(p.relative_to(ROOT)))]
    assert not findings, "\n".join(findings)


def test_the_unpickling_scan_finds_what_it_must() -> None:
    bad = '''
import pickle, pickle as pk, joblib, shelve, torch, numpy as np, pandas as pd
from pickle import loads as unsafe
from torch import load as tload
pickle.load(f)
pk.loads(b)
unsafe(b)
joblib.load(p)
shelve.open(p)
torch.load(p)
torch.load(p, weights_only=False)
tload(p, map_location="cpu")
np.load(p, allow_pickle=True)
np.load(p, allow_pickle=flag)
pd.read_pickle(p)
'''
    found = unpickling_calls(bad)
    assert [f.split(":")[1] for f in found] == [str(n) for n in range(5, 16)], found
    good = '''
import torch, numpy as np, json, pickle
torch.load(p, map_location="cpu", weights_only=True)
np.load(p)
np.load(p, allow_pickle=False)
json.loads(s)
pickle.dumps(x)
'''
    assert unpickling_calls(good) == []
