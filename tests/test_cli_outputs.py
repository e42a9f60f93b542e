"""Every command that writes makes its output's folder, or refuses in one line before any work: a
file in the way, a folder where a file is wanted, a file where a folder is wanted."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from vit_demo.cli.common import prepare_outputs
from vit_demo.cli.main import build_parser, main
from vit_demo.train.builtin import make_digits

ROOT = Path(__file__).resolve().parent.parent
DEIT = str(ROOT / "weights" / "deit_tiny_patch16_224.safetensors")

# Every flag of the command line that names something the command writes, and its kind.
WRITERS = {
    ("train", "--out"): "file", ("train", "--snapshots"): "folder", ("deck", "--out"): "file",
    ("port", "--out"): "file", ("explain", "--out"): "folder", ("survey", "--out"): "folder",
    ("atlas", "--out"): "folder", ("sanity", "--out"): "folder", ("data shapes", "--out"): "folder",
    ("data digits", "--out"): "folder", ("steps", "--out"): "folder",
}


def subcommands(parser: argparse.ArgumentParser, prefix: str = "") -> dict[str, argparse.ArgumentParser]:
    """Every (nested) sub-command's parser by its name ("data shapes")."""
    found = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                full = f"{prefix} {name}".strip()
                found[full] = sub
                found.update(subcommands(sub, full))
    return found


def test_every_flag_that_writes_is_a_declared_output() -> None:
    """The declared outputs are exactly the flags that write; a new --out that forgets to declare
    itself (and so would not get its folder made) fails here."""
    declared, writing = {}, set()
    for name, sub in subcommands(build_parser()).items():
        for _dest, flag, kind in sub.get_default("outputs") or ():
            declared[(name, flag)] = kind
        writing |= {(name, s) for a in sub._actions for s in a.option_strings if s in ("--out", "--snapshots")}
    assert declared == WRITERS
    assert writing == set(WRITERS)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> dict[str, Path]:
    """A tiny digits ImageFolder, one picture, a plain file and a folder that exist."""
    root = tmp_path_factory.mktemp("inputs")
    make_digits(root / "digits", per_class=3)
    pic = root / "pic.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (48, 48, 3), dtype=np.uint8)).save(pic)
    (root / "afile").write_text("in the way\n")
    (root / "afolder").mkdir()
    return {"digits": root / "digits", "pic": pic, "file": root / "afile", "folder": root / "afolder"}


def argv_for(command: str, flag: str, path: Path, inp: dict[str, Path]) -> list[str]:
    """A command line of ``command`` that would do real work, with ``path`` as its ``flag``."""
    pic, digits = str(inp["pic"]), str(inp["digits"])
    out = ["--out", str(path)]
    lines = {
        "train": ["train", "--data", digits, "--epochs", "1", "--no-progress"]
                 + (out if flag == "--out" else ["--out", str(inp["folder"] / "m.safetensors"), "--snapshots", str(path)]),
        "deck": ["deck", pic, "--no-progress", *out],
        "port": ["port", "--model", "deit_tiny_patch16_224", "--from", DEIT, *out],
        "explain": ["explain", pic, "--method", "rollout", *out],
        "survey": ["survey", "--images", digits, "--no-progress", *out],
        "atlas": ["atlas", "--images", digits, "--no-progress", *out],
        "sanity": ["sanity", "--images", pic, "--methods", "rollout", *out],
        "data shapes": ["data", "shapes", "--per-class", "2", *out],
        "data digits": ["data", "digits", *out],
        "steps": ["steps", pic, *out],
    }
    return lines[command]


def blocked_paths(kind: str, inp: dict[str, Path]) -> list[tuple[Path, str]]:
    """Paths an output of ``kind`` cannot take, with what the refusal must say."""
    blocked = [(inp["file"] / "new" / ("m.safetensors" if kind == "file" else "dir"), "is a file, so the folder")]
    if kind == "file":
        blocked.append((inp["folder"], "that is a folder; give a file name"))
    else:
        blocked.append((inp["file"], "that is a file, not a folder"))
    return blocked


@pytest.mark.parametrize(("command", "flag"), sorted(WRITERS))
def test_a_blocked_output_is_refused_before_any_work(command: str, flag: str, inputs, capsys, tmp_path: Path) -> None:
    """One line on stderr, exit code 2, nothing on stdout (no header, no epoch, no model loaded) and
    nothing written: the refusal comes before the work, not after it as a traceback."""
    for path, words in blocked_paths(WRITERS[command, flag], inputs):
        before = sorted(p.name for p in inputs["folder"].iterdir())
        rc = main(argv_for(command, flag, path, inputs))
        out, err = capsys.readouterr()
        assert rc == 2, (command, flag, path, err)
        assert out == "" and err.count("\n") == 1, (out, err)
        assert err.startswith(f"error: {flag} {path}: ") and words in err, err
        assert sorted(p.name for p in inputs["folder"].iterdir()) == before  # no .train-state, no checkpoint


@pytest.mark.parametrize(("command", "flag"), sorted(WRITERS))
def test_a_new_nested_output_gets_its_folder_before_the_work(command: str, flag: str, inputs, tmp_path: Path) -> None:
    """The folders an output needs are made when the line is read, before the command starts."""
    path = tmp_path / "new" / "deeper" / ("m.safetensors" if WRITERS[command, flag] == "file" else "dir")
    args = build_parser().parse_args(argv_for(command, flag, path, inputs))
    made = prepare_outputs(args)
    folder = path.parent if WRITERS[command, flag] == "file" else path
    assert folder.is_dir() and folder in made
    assert not (WRITERS[command, flag] == "file" and path.exists())  # the file itself is the command's to write


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root writes into read-only folders")
def test_a_read_only_folder_is_refused(inputs, capsys, tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        assert main(argv_for("data digits", "--out", locked / "x", inputs)) == 2
        assert "is not writable" in capsys.readouterr().err
    finally:
        locked.chmod(0o755)


@pytest.mark.slow
def test_port_writes_into_a_new_nested_folder(tmp_path: Path) -> None:
    out = tmp_path / "new" / "dir" / "deit.safetensors"
    r = subprocess.run([sys.executable, "-m", "vit_demo", "port", "--model", "deit_tiny_patch16_224", "--from", DEIT,
                        "--out", str(out)],
                       capture_output=True, text=True, cwd=ROOT, env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=300)
    assert r.returncode == 0, r.stderr
    assert out.stat().st_size > 20_000_000 and f"saved {out}" in r.stdout


@pytest.mark.slow
def test_train_into_new_folders_writes_everything(inputs, tmp_path: Path) -> None:
    """The crash this guards: ``train --out NEW/DIR/m.safetensors`` died after its first epoch
    saving the training state into a folder that did not exist."""
    out, snaps = tmp_path / "new" / "dir" / "m.safetensors", tmp_path / "other" / "snaps"
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "vit_demo", "train", "--data", str(inputs["digits"]), "--out", str(out),
                        "--epochs", "2", "--snapshots", str(snaps), "--no-progress"],
                       capture_output=True, text=True, cwd=ROOT, env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "Traceback" not in r.stderr
    assert sorted(p.name for p in out.parent.iterdir()) == ["m.curves.png", "m.safetensors", "m.safetensors.train-state"]
    assert (snaps / "filmstrip.png").is_file() and (snaps / "epoch_0002.png").is_file()
    assert f"saved {out}: the weights of epoch" in r.stdout, (r.stdout, time.perf_counter() - t0)
