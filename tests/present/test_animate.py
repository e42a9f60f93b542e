"""Attention in motion (vit_demo.present.animate): the maps per layer end where the methods end, and
the GIF / MP4 files open with imageio with the expected frame count and size."""

from __future__ import annotations

import json

import imageio.v2 as iio2
import imageio.v3 as iio
import numpy as np
import pytest
import torch
from PIL import Image
from skimage import data

from vit_demo.cli.main import main
from vit_demo.methods.attention import cls_attention
from vit_demo.methods.gradients import attention_gradients, chefer_relevance
from vit_demo.methods.rollout import rollout
from vit_demo.preprocess import preprocess
from vit_demo.present import animate


@pytest.fixture(scope="module")
def cat() -> Image.Image:
    return Image.fromarray(data.chelsea())


@pytest.fixture(scope="module")
def clips(deit_tiny, cat):
    x, picture = preprocess(cat, deit_tiny.data_config)
    made, info = animate.layer_clips(deit_tiny.model, x[None], labels=deit_tiny.labels)
    return x[None], picture, made, info


def test_last_frame_is_the_method_and_first_frames_are_prefixes(deit_tiny, clips):
    x, _, made, info = clips
    by = {c.name: c.maps for c in made}
    assert [c.name for c in made] == list(animate.CLIPS)
    assert all(m.shape == (12, 14, 14) for m in by.values())
    ag = attention_gradients(deit_tiny.model, x)
    assert info["target"] == int(ag.target[0]) and info["label"] == deit_tiny.labels[info["target"]]
    np.testing.assert_allclose(by["rollout"][-1], rollout(ag.attentions, ag.layout)[0].numpy(), atol=1e-6)
    np.testing.assert_allclose(
        by["relevance"][-1], chefer_relevance(ag.attentions, ag.grads, ag.layout)[0].numpy(), rtol=1e-4, atol=1e-6
    )
    for layer in (0, 5, 11):
        np.testing.assert_allclose(
            by["attention"][layer], cls_attention(ag.attentions, ag.layout, layer)[0].numpy(), atol=1e-7
        )
    # rollout after the first layer is that layer's (A + I) row-normalised [class] row
    a0 = ag.attentions[0].mean(1)[0]
    r0 = (a0 + torch.eye(a0.shape[-1])) / (a0 + torch.eye(a0.shape[-1])).sum(-1, keepdim=True)
    np.testing.assert_allclose(by["rollout"][0], r0[0, 1:].reshape(14, 14).numpy(), atol=1e-6)
    # relevance only accumulates (every (grad A * A)^+ term is >= 0)
    assert (np.diff(by["relevance"].reshape(12, -1), axis=0) >= -1e-7).all()


def test_one_head_and_bad_settings(deit_tiny, clips):
    x = clips[0]
    one, _ = animate.layer_clips(deit_tiny.model, x, ("attention",), head=2)
    assert one[0].title == "Attention (head 3)"  # head=2 is the index: the third of three heads, as people count
    with pytest.raises(ValueError, match="head 3"):
        animate.layer_clips(deit_tiny.model, x, ("attention",), head=3)
    with pytest.raises(ValueError, match="unknown clip"):
        animate.layer_clips(deit_tiny.model, x, ("saliency",))


def test_gif_frames_durations_and_fixed_scale(clips, tmp_path):
    _, picture, made, _ = clips
    anim = animate.render(picture, made, "caption", width=640, tween=1, step_s=0.5, tween_s=0.1, hold_s=1.5)
    assert len(anim.frames) == 12 + 11 * 1
    assert anim.durations[0] == anim.durations[-1] == 1.5 and anim.durations[1] == 0.1 and anim.durations[2] == 0.5
    path = animate.write_gif(anim, tmp_path / "a.gif")
    frames = iio.imread(path, index=None)
    assert frames.shape[:3] == (23, 360, 640)
    meta = Image.open(path)
    assert meta.info["loop"] == 0 and meta.info["duration"] == 1500
    # the same layer renders the same whatever the others hold: the colour scale is per clip
    again = animate.render(picture, [type(c)(c.name, c.title, c.maps.copy()) for c in made], "caption", width=640, tween=0)
    assert np.array_equal(np.asarray(again.frames[5]), np.asarray(anim.frames[10]))


def test_mp4_is_h264_wide_enough_with_expected_frames(clips, tmp_path):
    _, picture, made, _ = clips
    anim = animate.render(picture, made[1:2], width=1280, tween=0, step_s=0.08, hold_s=0.2)
    path = animate.write_mp4(anim, tmp_path / "a.mp4", fps=25)
    assert anim.mp4_frame_count(25) == 2 * 5 + 10 * 2
    r = iio2.get_reader(path, "ffmpeg")
    try:
        meta = r.get_meta_data()
        assert meta["size"] == (1280, 720) and meta["codec"] == "h264"
        assert r.count_frames() == anim.mp4_frame_count(25)
        first = r.get_data(0)
    finally:
        r.close()
    assert first.shape == (720, 1280, 3) and first.mean() > 128  # a white frame with pictures, not black


def test_cli_animation(deit_tiny_path, tmp_path, capsys):
    img = tmp_path / "cat.png"
    Image.fromarray(data.chelsea()).save(img)
    out = tmp_path / "out"
    rc = main(["explain", str(img), "--method", "animation", "--out", str(out), "--weights", str(deit_tiny_path),
               "--width", "480", "--head", "1"])
    assert rc == 0
    assert "wrote" in capsys.readouterr().out
    rec = json.loads((out / "cat_animation.json").read_text())
    assert rec["files"] == ["cat_animation.gif"] and rec["frames"] == [45] and rec["size"] == [480, 270]
    assert rec["settings"]["head"] == 1 and rec["label"] and set(rec["scales"]) == set(animate.CLIPS)
    assert iio.imread(out / "cat_animation.gif", index=None).shape[:3] == (45, 270, 480)
    assert main(["explain", str(img), "--method", "animation", "--format", "svg", "--out", str(out),
                 "--weights", str(deit_tiny_path)]) == 2
    assert "is for figures" in capsys.readouterr().err
