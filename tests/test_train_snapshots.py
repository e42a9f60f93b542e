"""What a model in training sees, every few epochs (vit_demo.train.snapshots): the loop's
``on_epoch`` hook, the frames, ``train --snapshots DIR`` writing them with a GIF and an MP4, and
the Train tab's run in a child process telling what it sees.

Real runs on scikit-learn's real digits (a few epochs, seconds each): the untrained model's maps
are near uniform and its attention distance is the uniform one; after training they are not.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from app_server import ROOT
from PIL import Image

from vit_demo.train.builtin import ensure, make_digits
from vit_demo.train.loop import TrainOptions, run
from vit_demo.train.snapshots import Recorder, every_for, fixed_pictures


@pytest.fixture(scope="module")
def digits(tmp_path_factory) -> Path:
    """40 real scans of each digit (an epoch takes a second or less)."""
    return make_digits(tmp_path_factory.mktemp("data") / "digits", per_class=40)


def test_fixed_pictures_one_per_class_spread() -> None:
    targets = [t for t in range(10) for _ in range(3)]
    assert fixed_pictures(targets, 10) == [0, 9, 18, 27]  # classes 0, 3, 6, 9: the first picture of each
    assert fixed_pictures([1, 0, 1, 0], 2) == [1, 0]  # class 0 first, then class 1
    assert fixed_pictures([0, 0, 2], 3) == [0, 2]  # a class with no picture is skipped
    assert every_for(50, None) == 5 and every_for(7, None) == 1 and every_for(50, 20) == 20


def test_builtin_digits_are_the_real_scans(tmp_path: Path) -> None:
    digits = ensure("digits", tmp_path)
    assert ensure("digits", tmp_path) == digits == tmp_path / "digits"  # written once
    folders = sorted(p.name for p in digits.iterdir())
    assert folders == [f"digit{i}" for i in range(10)]
    assert sum(len(list((digits / f).glob("*.png"))) for f in folders) == 1797
    with Image.open(next((digits / "digit0").glob("*.png"))) as im:
        assert im.size == (8, 8) and im.getextrema()[1] == 255  # 0..16 scaled to 0..255
    assert [p.name for p in tmp_path.iterdir()] == ["digits"]  # no half-written folder left


class Stop(Exception):
    pass


@pytest.mark.slow  # trains
def test_hook_sees_the_untrained_model_then_every_epoch_and_can_stop_the_run(digits: Path, tmp_path: Path) -> None:
    seen: list[tuple[int, set[str], bool]] = []

    def hook(s, row, model):
        seen.append((row["epoch"], set(row), model.training))
        if row["epoch"] == 2:
            raise Stop

    out = tmp_path / "m.safetensors"
    with pytest.raises(Stop):
        run(TrainOptions(data=str(digits), out=str(out), epochs=4, progress=False, on_epoch=hook), log=lambda m: None)
    assert [e for e, _, _ in seen] == [0, 1, 2]
    assert seen[0][1] == {"epoch"} and {"train_loss", "val_accuracy"} <= seen[1][1]
    assert not out.exists()  # stopped: no checkpoint


@pytest.mark.slow  # trains
def test_snapshots_go_from_uniform_to_focused(digits: Path, tmp_path: Path) -> None:
    rec = Recorder(tmp_path / "snaps")
    run(TrainOptions(data=str(digits), out=str(tmp_path / "m.safetensors"), epochs=4, batch_size=16, progress=False,
                     on_epoch=rec),
        log=lambda m: None)
    assert [s.epoch for s in rec.snaps] == [0, 1, 2, 3, 4]
    assert [p.name for p in rec.frames] == [f"epoch_000{i}.png" for i in range(5)]
    assert rec.names == ["digit0", "digit3", "digit6", "digit9"]
    first, last = rec.snaps[0], rec.snaps[-1]
    patches = first.rollout.shape[-1] * first.rollout.shape[-2]
    assert first.rollout.shape == (4, 4, 4)  # 8-px digits, 2-px patches
    np.testing.assert_allclose(first.rollout.sum((1, 2)), 1.0, atol=1e-5)
    assert first.rollout.max() * patches < 1.2  # untrained: every patch gets about 1/16
    assert abs(first.distance.mean() / first.uniform - 1) < 0.02  # ... at the uniform distance
    assert last.rollout.max() * patches > 1.5 * first.rollout.max() * patches  # trained: attention has a place
    sizes = {Image.open(p).size for p in rec.frames}
    assert len(sizes) == 1 and all(v % 2 == 0 for v in next(iter(sizes)))  # one size, even (H.264)
    strip = rec.strip()
    assert strip.width > 5 * 96 and strip.height > 4 * 96


@pytest.mark.slow  # trains
def test_cli_writes_frames_gif_and_mp4(digits: Path, tmp_path: Path) -> None:
    snaps = tmp_path / "snaps"
    r = subprocess.run([sys.executable, "-m", "vit_demo", "train", "--data", str(digits), "--out",
                        str(tmp_path / "m.safetensors"), "--epochs", "2", "--snapshots", str(snaps), "--no-progress",
                        "--json"], capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    assert summary["snapshots"]["epochs"] == [0, 1, 2]
    assert summary["snapshots"]["frames"] == ["epoch_0000.png", "epoch_0001.png", "epoch_0002.png"]
    with Image.open(snaps / "snapshots.gif") as gif:
        assert gif.n_frames == 3
    assert (snaps / "snapshots.mp4").stat().st_size > 1000 and (snaps / "filmstrip.png").is_file()


def test_the_live_child_tells_its_run_in_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """vit_demo.train.live's child (what the Train tab runs in a process of its own), run here on 30
    scans for two epochs, its watch on the parent and the deadline left out: what it sends, each
    message as the pipe would carry it, is its log, the untrained model's frame (with the pictures
    and their names), then every epoch's row and frame, then the summary with every file it wrote."""
    import pickle

    import torch

    from vit_demo.train import live

    monkeypatch.setattr(live, "watch", lambda parent, deadline: None)  # (it would end this process at the deadline)
    sent: list[tuple[str, object]] = []

    class Pipe:
        closed = False

        def send(self, message):
            sent.append(pickle.loads(pickle.dumps(message)))

        def close(self):
            self.closed = True

    data = make_digits(tmp_path / "digits", per_class=3)
    opts = TrainOptions(data=str(data), out=str(tmp_path / "m.safetensors"), epochs=2, batch_size=8, img_size=16,
                        seed=1)
    pipe = Pipe()
    live.child(pipe, opts, str(tmp_path / "snaps"), 1, torch.get_num_threads(), 600.0, 0)
    kinds = [k for k, _ in sent]
    assert pipe.closed and kinds[-1] == "done", sent[-1]
    assert [k for k in kinds if k not in ("log", "stage")] == ["plan", "frame", "epoch", "frame", "epoch", "frame", "done"]
    assert kinds.index("log") < kinds.index("epoch") and kinds.index("stage") < kinds.index("frame")
    frames = [m for k, m in sent if k == "frame"]
    assert frames[0]["names"] == ["digit0", "digit3", "digit6", "digit9"] and len(frames[0]["pictures"]) == 4
    assert all(f["pictures"] is None for f in frames[1:])
    rows = [m for k, m in sent if k == "epoch"]
    assert [r["row"]["epoch"] for r in rows] == [1, 2] and {r["epochs"] for r in rows} == {2}
    done = sent[-1][1]
    assert done["summary"]["out"] == opts.out and Path(opts.out).is_file()
    assert done["frames"] == [f["path"] for f in frames] and all(Path(p).is_file() for p in done["frames"])
