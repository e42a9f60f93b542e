"""Training: from scratch (JSON, checkpoint, curves), resume after a kill equals an
uninterrupted run, two-process torchrun, a linear probe on DeiT-Tiny, and the trained
checkpoint predicting its own class names with timm blocked.

Kept small: 400 shapes of the original, bright set at 32 px, patch 8 (a 4x4 grid), 6 epochs
(each run 10-30 s of CPU). A ViT needs thousands of steps on the hard default shapes
(benchmarks/bench_train.py measures the real run); here the check is that learning starts:
losses fall well below chance's ln 4.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from vit_demo.train.data import EASY, make_shapes
from vit_demo.train.loop import state_path
from vit_demo.train.recipe import (
    Recipe,
    finetune_recipe,
    make_optimizer,
    scratch_config,
    scratch_recipe,
    warmup_cosine,
    with_new_head,
)

ROOT = Path(__file__).resolve().parent.parent
FLAGS = ["--patch-size", "8", "--epochs", "6", "--batch-size", "16", "--lr", "1e-3", "--val-split", "0.2", "--seed", "3",
         "--no-progress"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
KEYS = ["classes", "train_images", "val_images", "skipped_files", "epochs", "val_accuracy", "best_val_accuracy", "best_epoch",
        "seconds", "out", "device", "processes", "budget_seconds", "baseline_accuracy", "fit", "fit_note"]


def vit_demo(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "vit_demo", *args], capture_output=True, text=True, cwd=ROOT, env=ENV,
                          timeout=timeout)


@pytest.fixture(scope="module")
def shapes(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("shapes")
    make_shapes(root, per_class=100, size=32, seed=1, progress=False, style=EASY)  # the bright set: learning starts in 6 epochs
    return root


@pytest.fixture(scope="module")
def trained(shapes: Path, tmp_path_factory) -> tuple[dict, Path, str]:
    out = tmp_path_factory.mktemp("run") / "shapes.safetensors"
    r = vit_demo("train", "--data", str(shapes), "--out", str(out), *FLAGS, "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout), out, r.stderr


@pytest.mark.slow  # trains
def test_scratch_training_learns_and_reports(trained: tuple[dict, Path, str]) -> None:
    summary, out, log = trained
    assert list(summary) == KEYS and summary["out"] == str(out)
    assert (summary["device"], summary["processes"]) == ("cpu", 1) and "; on cpu" in log
    assert summary["classes"] == ["circle", "square", "star", "triangle"]
    assert (summary["train_images"], summary["val_images"], summary["skipped_files"], summary["epochs"]) == (320, 80, 0, 6)
    lines = [ln for ln in log.splitlines() if ln.startswith("epoch ")]
    assert len(lines) == 6 and all("val acc" in ln and "img/s" in ln for ln in lines)
    train_loss = [float(ln.split("train loss")[1].split()[0]) for ln in lines]
    val_loss = [float(ln.split("val loss")[1].split()[0]) for ln in lines]
    assert train_loss[-1] < train_loss[0] - 0.03 and val_loss[-1] < math.log(4) - 0.04, log  # learning has started
    assert summary["best_val_accuracy"] >= 0.3, log  # chance: 0.25
    with safe_open(str(out), "pt") as f:
        meta = f.metadata()
    assert json.loads(meta["class_names"]) == summary["classes"]
    training = json.loads(meta["training"])
    assert training["mode"] == "scratch" and len(training["history"]) == 6 and training["seed"] == 3
    assert json.loads(meta["config"])["patch_size"] == 8 and json.loads(meta["data_config"])["input_size"] == [32, 32]
    assert out.with_name("shapes.curves.png").stat().st_size > 5000
    assert state_path(out).is_file()


@pytest.mark.slow  # trains
def test_checkpoint_predicts_its_classes_without_timm(trained: tuple[dict, Path, str], shapes: Path) -> None:
    _, out, _ = trained
    code = ("import sys; sys.modules['timm'] = None\nfrom vit_demo.cli.main import main\n"
            f"sys.exit(main(['predict', {str(shapes / 'star')!r}, '--weights', {str(out)!r}, '--topk', '4', '--json']))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=ENV, timeout=120)
    assert r.returncode == 0, r.stderr
    results = json.loads(r.stdout)
    assert len(results) == 100 and {t["label"] for t in results[0]["topk"]} == {"circle", "square", "star", "triangle"}


@pytest.mark.slow  # trains
def test_resume_after_kill_equals_uninterrupted(trained: tuple[dict, Path, str], shapes: Path, tmp_path: Path) -> None:
    summary, reference, _ = trained
    out = tmp_path / "shapes.safetensors"
    cmd = [sys.executable, "-m", "vit_demo", "train", "--data", str(shapes), "--out", str(out), *FLAGS, "--json"]
    # SIGINT back to its default in the child, as in a terminal: a shell that starts the tests in the
    # background (``cmd &``) ignores SIGINT, the child inherits that, and Python then never raises
    # KeyboardInterrupt
    p = subprocess.Popen(cmd, cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 240
    while not state_path(out).exists() and p.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    p.send_signal(signal.SIGINT)  # Ctrl-C after the first finished epoch
    _, err = p.communicate(timeout=120)
    assert p.returncode == 130 and "resume with --resume" in err, err
    done = torch.load(state_path(out), weights_only=True)["epoch"]
    assert 1 <= done < 6 and not out.exists(), f"the run was not stopped mid-way (epoch {done})"
    r = vit_demo("train", "--data", str(shapes), "--out", str(out), *FLAGS, "--json", "--resume")
    assert r.returncode == 0 and f"resuming after epoch {done}/6" in r.stderr, r.stderr
    resumed = json.loads(r.stdout)
    assert {k: v for k, v in resumed.items() if k not in ("seconds", "out")} == \
        {k: v for k, v in summary.items() if k not in ("seconds", "out")}
    a, b = load_file(str(reference)), load_file(str(out))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)  # bit for bit
    # resuming with other settings is refused in one line
    r = vit_demo("train", "--data", str(shapes), "--out", str(out), *FLAGS, "--lr", "5e-4", "--resume")
    assert r.returncode == 2 and "different recipe" in r.stderr, r.stderr


@pytest.mark.slow  # trains
def test_torchrun_two_processes(trained: tuple[dict, Path, str], shapes: Path, tmp_path: Path) -> None:
    single, _, _ = trained
    out = tmp_path / "ddp.safetensors"
    torchrun = Path(sys.executable).with_name("torchrun")
    cmd = [str(torchrun), "--standalone", "--nproc_per_node=2", "-m", "vit_demo", "train", "--data", str(shapes), "--out",
           str(out), *FLAGS, "--json"]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=ENV, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    objects = [json.loads(ln) for ln in r.stdout.splitlines() if ln.startswith("{")]
    assert len(objects) == 1 and list(objects[0]) == KEYS, r.stdout  # printed once, by rank 0
    assert objects[0]["processes"] == 2 and "on cpu, 2 processes (gloo)" in r.stderr
    assert sum(ln.startswith("epoch ") for ln in r.stderr.splitlines()) == 6
    with safe_open(str(out), "pt") as f:
        assert json.loads(f.metadata()["training"])["processes"] == 2
    assert objects[0]["best_val_accuracy"] >= 0.3 and abs(objects[0]["best_val_accuracy"] - single["best_val_accuracy"]) <= 0.2


@pytest.mark.slow  # trains
def test_linear_probe_on_deit_tiny(shapes: Path, deit_tiny_path: Path, tmp_path: Path) -> None:
    out = tmp_path / "probe.safetensors"
    r = vit_demo("train", "--data", str(shapes), "--out", str(out), "--from", "--freeze-backbone", "--img-size", "64",
                 "--epochs", "3", "--batch-size", "16", "--no-progress", "--json")
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    assert summary["best_val_accuracy"] >= 0.5, r.stderr  # DeiT features + a trained head beat chance (0.25)
    new, old = load_file(str(out)), load_file(str(deit_tiny_path))
    assert new["head.weight"].shape == (4, 192)
    frozen = [k for k in old if not k.startswith(("head.", "pos_embed"))]
    assert all(torch.equal(new[k], old[k]) for k in frozen)  # the backbone did not move
    with safe_open(str(out), "pt") as f:
        meta = f.metadata()
    assert json.loads(meta["training"])["mode"] == "linear-probe" and json.loads(meta["data_config"])["input_size"] == [64, 64]


def test_scratch_defaults_follow_the_data() -> None:
    """The epochs come from the time budget (the recipe's own count is a placeholder), a compact
    convolutional transformer by default (CCT's pooled tokenizer, the patch tokens' mean as the
    read-out, no [class] token) with a power-of-2 patch, the plain ViT with its [class] token on request."""
    r = scratch_recipe()
    assert (r.epochs, r.warmup_epochs, r.batch_size, r.augment.scale) == (100, 5, 64, (0.75, 1.0))
    conv, plain = scratch_config(32, 4, stem="conv"), scratch_config(32, 4)
    assert conv.conv_stem and conv.stem_pool and conv.stem_width == 64 and conv.patch_size == 4
    assert (conv.class_token, conv.global_pool, conv.fc_norm) == (False, "avg", True)
    assert not plain.conv_stem and plain.class_token and plain.global_pool == "token"
    assert [scratch_config(n, 4, stem="conv").patch_size for n in (64, 48, 40, 50)] == [8, 8, 4, 2]
    from vit_demo.train.data import DataError

    with pytest.raises(DataError, match="power of 2"):
        scratch_config(36, 4, patch_size=6, stem="conv")


def test_finetune_groups_and_schedule(deit_tiny) -> None:
    model = with_new_head(deit_tiny.model, 3)
    assert model.head.weight.shape == (3, 192) and not model.head.weight.any()
    assert torch.equal(model.blocks[0].attn.qkv.weight, deit_tiny.model.blocks[0].attn.qkv.weight)
    recipe: Recipe = finetune_recipe(False)
    opt = make_optimizer(model, recipe, freeze=False)
    lrs = {(any(p is model.head.weight for p in g["params"]), g["weight_decay"] > 0): g["lr"] for g in opt.param_groups}
    assert lrs[(True, True)] == recipe.lr and lrs[(False, True)] == pytest.approx(recipe.lr * 0.1)
    assert sum(len(g["params"]) for g in opt.param_groups) == len(list(model.parameters()))
    f = warmup_cosine(100, 10)
    assert f(0) == pytest.approx(0.1) and f(9) == 1.0 and f(55) == pytest.approx(0.5) and f(100) == pytest.approx(0.0)


def test_timm_twin_of_a_trained_checkpoint(tmp_path: Path) -> None:
    """A checkpoint trained here has no timm model name: timm's VisionTransformer is built from
    its config and must give the same logits (the app's "Compare with timm" tab)."""
    from vit_demo.checkpoints.files import save
    from vit_demo.checkpoints.load import load_model
    from vit_demo.checkpoints.verify import timm_twin
    from vit_demo.model import VisionTransformer
    from vit_demo.train.recipe import scratch_config, scratch_data_config

    torch.manual_seed(0)
    model = VisionTransformer(scratch_config(32, 4)).init_weights()
    torch.nn.init.normal_(model.head.weight, std=0.1)
    path = save(model, scratch_data_config(32), tmp_path / "t.safetensors", name="", class_names=list("abcd"))
    lm = load_model(weights=path, device="cpu")
    assert lm.timm_name is None and lm.labels == tuple("abcd")
    x = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        assert torch.allclose(lm.model(x).logits, timm_twin(lm, path)(x), atol=1e-5)
