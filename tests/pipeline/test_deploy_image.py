"""deploy/image/Containerfile: the invariants of the server image, checked without a container engine.

Building and running it needs podman and a base image (deploy/image/build.sh, deploy/image/smoke.sh; done by hand
on this machine, deploy/image/README.md); CI has neither, so these tests hold the recipe to what that run showed:
two stages, the base install only (no torch, no extras), the sources it copies are all the server imports, a
non-root numeric user that matches the KServe runtime's, an exec-form entrypoint (the server is PID 1 and gets
SIGTERM), and default arguments the server accepts, on KServe's ports, serving /mnt/models.
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from server.runtime.settings import settings_from_args
from tests.server_process import ROOT

IMAGE = ROOT / "deploy" / "image"
OUTSIDE_THE_IMAGE = ("torch", "ray", "training", "export", "clients", "pipeline", "testing", "transformers")


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the Containerfile, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n\s*", " ", (IMAGE / "Containerfile").read_text())
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1] if " " in line else "") for line in lines]


def stages() -> list[list[tuple[str, str]]]:
    found: list[list[tuple[str, str]]] = []
    for op, args in instructions():
        if op == "FROM":
            found.append([])
        if found:
            found[-1].append((op, args))
    return found


def final(op: str) -> list[str]:
    return [args for o, args in stages()[-1] if o == op]


def test_two_stages_and_the_runtime_stage_starts_from_the_base_not_the_build() -> None:
    build, runtime = stages()
    assert build[0] == ("FROM", "${BASE} AS build")
    assert runtime[0] == ("FROM", "${BASE}")
    assert [args for op, args in runtime if op == "COPY"] == ["--from=build /opt/ortserve /opt/ortserve"]


def test_the_install_is_the_base_server_only_from_local_wheels() -> None:
    build, _ = stages()
    env = " ".join(args for op, args in build if op == "ENV")
    assert "PIP_NO_INDEX=1" in env  # nothing is fetched while building
    runs = " ".join(args for op, args in build if op == "RUN")
    assert "pip install --find-links /wheels --find-links /dist -c /src/constraints.txt ortserve " in runs + " "
    assert "[" not in runs.split("ortserve ")[1].split("&&")[0]  # no extras
    assert "'torch' not in sys.modules" in runs and '! /opt/ortserve/bin/python -c "import torch"' in runs
    # build.sh downloads only [project].dependencies (no extra): torch cannot be in the wheelhouse
    script = (IMAGE / "build.sh").read_text()
    assert '["project"]["dependencies"]' in script and "optional-dependencies" not in script


def test_the_copied_sources_are_all_the_server_imports(tmp_path: Path) -> None:
    """Only modelpkg/, protos/ and server/ go into the image: importing every server module (but server.ray, the
    Ray Serve extra) from a copy of just those pulls in none of the other stages, nor torch or ray."""
    build, _ = stages()
    copied = [args.split()[0].rstrip("/") for op, args in build if op == "COPY"]
    packages = [c for c in copied if (ROOT / c).is_dir() and c != "deploy/image/wheels"]
    assert sorted(packages) == ["modelpkg", "protos", "server"]
    for package in packages:
        shutil.copytree(ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    modules = sorted(".".join(p.relative_to(tmp_path).with_suffix("").parts).removesuffix(".__init__")
                     for p in (tmp_path / "server").rglob("*.py")
                     if p.name != "__main__.py" and "ray" not in p.relative_to(tmp_path / "server").parts)
    script = ("import importlib, sys\n"
              f"sys.path.insert(0, {str(tmp_path)!r})\n"
              f"for m in {modules!r}: importlib.import_module(m)\n"
              "bad = sorted({n.split('.')[0] for n in sys.modules} & set(" + repr(OUTSIDE_THE_IMAGE) + "))\n"
              "assert all(sys.modules[m].__file__.startswith(" + repr(str(tmp_path)) + ") for m in "
              + repr(modules) + ")\n"
              "print(bad)\n")
    run = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                         env={"PATH": "/usr/bin:/bin"})
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip() == "[]"
    # and the build context lets exactly those through (.containerignore)
    allowed = {line.lstrip("!").rstrip("/") for line in (ROOT / ".containerignore").read_text().split()
               if line.startswith("!")}
    sources = {s.rstrip("/") for op, args in build if op == "COPY" for s in args.split()[:-1]}
    assert sources == allowed


def test_non_root_user_matches_the_kserve_runtime() -> None:
    (user,) = final("USER")
    uid, gid = (int(x) for x in user.split(":"))  # numeric: runAsNonRoot can check it without /etc/passwd
    assert uid != 0 and gid != 0
    runtime = yaml.safe_load((ROOT / "deploy" / "kserve" / "servingruntime.yaml").read_text())
    security = runtime["spec"]["containers"][0]["securityContext"]
    assert (security["runAsUser"], security["runAsGroup"]) == (uid, gid)
    runs = " ".join(final("RUN"))
    assert f"--uid {uid}" in runs and f"--gid {gid}" in runs and "mkdir -p /mnt/models" in runs


def test_exec_form_entrypoint_and_default_arguments_the_server_accepts(tmp_path: Path) -> None:
    (entrypoint,) = final("ENTRYPOINT")
    assert json.loads(entrypoint) == ["/opt/ortserve/bin/python", "-m", "server"]  # exec form: no shell in between
    (cmd,) = final("CMD")
    args = json.loads(cmd)
    assert args[args.index("--repository") + 1] == "/mnt/models"
    settings = settings_from_args([*args, "--repository", str(tmp_path)], environ={})
    assert (settings.host, settings.http_port, settings.port, settings.metrics_port) == ("0.0.0.0", 8080, 8081, 8082)
    (exposed,) = final("EXPOSE")
    assert exposed.split() == ["8080", "8081", "8082"]
