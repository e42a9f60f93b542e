"""Hostile checkpoints: code-running pickles, wrong architectures, truncated files, NaN/Inf,
missing / extra / mis-shaped keys, forged configs. Each is a CheckpointError that names the
problem, no code in a file ever runs, and a failed load never leaves a half-loaded model."""

from __future__ import annotations

import json
import pickle
import time
from pathlib import Path

import hostile
import numpy as np
import pytest
import timm
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from vit_demo.checkpoints import files as port
from vit_demo.checkpoints.files import CheckpointError, load_state_dict_strict, read_checkpoint
from vit_demo.checkpoints.load import from_checkpoint, load_model
from vit_demo.checkpoints.timm import from_timm

pytestmark = [pytest.mark.filterwarnings("ignore:Detected pickle protocol"),
              pytest.mark.filterwarnings("ignore:Initializing zero-element tensors")]


@pytest.fixture(scope="module")
def tiny():
    """A small random DeiT-Tiny (2 blocks), timm's and ours, with the same weights."""
    torch.manual_seed(0)
    tm = timm.create_model("deit_tiny_patch16_224", pretrained=False, depth=2).eval()
    model, dc = from_timm(tm)
    return tm, model, dc


@pytest.fixture(scope="module")
def real_sd(deit_tiny_path):
    return read_checkpoint(deit_tiny_path)[0]


def one_line(e: pytest.ExceptionInfo) -> str:
    msg = str(e.value)
    assert "\n" not in msg and msg, msg
    return msg


# ----------------------------------------------------------------------------- code execution


def test_pickles_that_run_code_are_refused_and_never_run(tmp_path, capsys):
    marker = tmp_path / "PWNED"
    files = hostile.malicious_checkpoints(tmp_path / "ckpt", marker)
    npz = tmp_path / "ckpt" / "objects.npz"
    np.savez(npz, x=np.array([hostile.marker_payloads(marker)["os_system"]], dtype=object))
    for name, path in [*files.items(), ("objects.npz", npz)]:
        with pytest.raises(CheckpointError) as ei:
            read_checkpoint(path)
        msg = one_line(ei)
        assert msg.startswith(path.name) and ("refused" in msg or "allow_pickle=False" in msg), msg
        assert "weights_only` set to `False" not in msg and "\x1b" not in msg  # no advice to load unsafely
        if name.startswith("zip_") or name == "raw_p2.pth":
            assert "posix.system" in msg or "exec" in msg  # names what the pickle asked for
        with pytest.raises(CheckpointError):
            from_checkpoint(path, "deit_tiny_patch16_224")
        with pytest.raises(CheckpointError):
            load_model("deit_tiny_patch16_224", path, device="cpu")
        assert not marker.exists(), f"{name}: the payload ran"

    # the CLI: one line on stderr, exit 2, still no marker
    from vit_demo.cli.main import main

    img = tmp_path / "x.png"
    hostile.quadrants().save(img)
    assert main(["predict", str(img), "--weights", str(files["zip_system.pth"])]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and "refused" in err and "posix.system" in err, err
    assert not marker.exists()

    # control: the payloads are live - an unsafe loader really runs them
    pickle.loads(files["raw_p2.pth"].read_bytes())
    assert marker.exists()
    marker.unlink()
    torch.load(files["zip_exec.bin"], weights_only=False)
    assert marker.read_text() == "pwned"


def test_garbage_pth_is_refused_not_executed(tmp_path):
    p = tmp_path / "noise.pth"
    p.write_bytes(np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8).tobytes())
    with pytest.raises(CheckpointError) as ei:
        read_checkpoint(p)
    assert "noise.pth" in one_line(ei)


# ----------------------------------------------------------------------------- broken files


@pytest.mark.parametrize("suffix", [".safetensors", ".pth", ".bin", ".npz"])
@pytest.mark.parametrize("content", [b"", b"x", b"1234567"])
def test_tiny_files(tmp_path, suffix, content):
    p = tmp_path / f"deit_tiny_patch16_224{suffix}"
    p.write_bytes(content)
    with pytest.raises(CheckpointError) as ei:
        from_checkpoint(p)
    n = len(content)
    assert one_line(ei) == f"{p.name}: file is {n} byte{'' if n == 1 else 's'}, too small to be a checkpoint"


def test_not_a_file_and_unknown_format(tmp_path):
    with pytest.raises(CheckpointError, match="no such file"):
        read_checkpoint(tmp_path / "nope.safetensors")
    p = tmp_path / "weights.txt"
    p.write_text("these are not weights")
    with pytest.raises(CheckpointError, match="unknown checkpoint format '.txt'"):
        read_checkpoint(p)


@pytest.mark.parametrize("keep", [9, 100, 5000, "half", -1])
def test_truncated_safetensors(deit_tiny_path, tmp_path, keep):
    size = deit_tiny_path.stat().st_size
    n = {"half": size // 2, -1: size - 1}.get(keep, keep)
    p = hostile.truncated_copy(deit_tiny_path, tmp_path / "deit_tiny_patch16_224.safetensors", n)
    with pytest.raises(CheckpointError) as ei:
        load_model("deit_tiny_patch16_224", p, device="cpu")
    msg = one_line(ei)
    assert msg.startswith(p.name + ": cannot read the checkpoint") and "header" in msg, msg


def test_safetensors_header_claiming_huge_length(tmp_path):
    p = tmp_path / "huge.safetensors"
    p.write_bytes((2**60).to_bytes(8, "little") + b"{}" * 20)
    t = time.perf_counter()
    with pytest.raises(CheckpointError, match="header too large"):
        read_checkpoint(p)
    assert time.perf_counter() - t < 1


def test_pth_without_tensors(tmp_path):
    p = tmp_path / "cfg.pth"
    torch.save({"epoch": 3, "lr": 0.1}, p)
    with pytest.raises(CheckpointError, match="no tensors found"):
        read_checkpoint(p)


def test_a_plain_pth_state_dict_loads(tiny, tmp_path):
    """Control for the refusals above: a weights-only .pth (wrapped as timm trainers save it)."""
    tm, model, _ = tiny
    p = tmp_path / "ok.pth"
    torch.save({"state_dict": {f"module.{k}": v for k, v in tm.state_dict().items()}, "epoch": 3}, p)
    sd, _ = read_checkpoint(p)
    assert sd.keys() == tm.state_dict().keys()


# ----------------------------------------------------------------------------- wrong contents


def test_wrong_architecture_vit_small_for_deit_tiny(tmp_path):
    torch.manual_seed(0)
    small = timm.create_model("vit_small_patch16_224", pretrained=False, depth=2)
    for name in ("model.safetensors", "deit_tiny_patch16_224.safetensors"):  # --model, or the file name
        p = tmp_path / name
        save_file({k: v.contiguous() for k, v in small.state_dict().items()}, str(p))
        with pytest.raises(CheckpointError) as ei:
            load_model("deit_tiny_patch16_224" if name == "model.safetensors" else None, p, device="cpu")
        msg = str(ei.value)
        assert msg.startswith(f"{name} does not fit this architecture")
        assert "missing keys: blocks.2.norm1.weight" in msg and "(120 in all)" in msg  # blocks 2..11
        assert "cls_token: checkpoint (1, 1, 384) vs model (1, 1, 192)" in msg
        assert "unexpected keys" not in msg


def test_nan_and_inf_weights_are_named(real_sd, tmp_path):
    sd = {k: v.clone() for k, v in real_sd.items()}
    sd["blocks.3.attn.qkv.weight"][5, 7] = float("nan")
    sd["head.bias"][9] = float("inf")
    p = tmp_path / "deit_tiny_patch16_224.safetensors"
    save_file(sd, str(p))
    with pytest.raises(CheckpointError) as ei:
        from_checkpoint(p)
    lines = str(ei.value).splitlines()
    assert lines[0] == f"{p.name} does not fit this architecture:"
    assert lines[1:] == ["  NaN/Inf values in: blocks.3.attn.qkv.weight, head.bias"]


@pytest.mark.parametrize("case", ["missing", "extra", "shape", "all_three"])
def test_missing_extra_and_misshaped_keys_are_named(tiny, tmp_path, case):
    """In a file this project saved (config in the metadata), tampered with."""
    tm, model, dc = tiny
    p = port.save(model, dc, tmp_path / "tiny.safetensors", name="deit_tiny_depth2")
    with safe_open(str(p), framework="pt") as f:
        meta, sd = f.metadata(), {k: f.get_tensor(k) for k in f.keys()}
    want = []
    if case in ("missing", "all_three"):
        del sd["blocks.1.mlp.fc2.bias"]
        want.append("  missing keys: blocks.1.mlp.fc2.bias")
    if case in ("extra", "all_three"):
        sd["blocks.7.attn.proj.weight"] = torch.zeros(3)
        want.append("  unexpected keys: blocks.7.attn.proj.weight")
    if case in ("shape", "all_three"):
        sd["head.weight"] = torch.zeros(10, 192)
        want.append("  wrong shapes: head.weight: checkpoint (10, 192) vs model (1000, 192)")
    save_file(sd, str(p), metadata=meta)
    with pytest.raises(CheckpointError) as ei:
        from_checkpoint(p)
    assert str(ei.value).splitlines() == ["tiny.safetensors does not fit this architecture:", *want]


def test_untampered_saved_file_round_trips(tiny, tmp_path):
    tm, model, dc = tiny
    p = port.save(model, dc, tmp_path / "tiny.safetensors")
    again, dc2, meta = from_checkpoint(p)
    assert dc2 == dc and meta["format"] == port.FORMAT_TAG
    for (k, a), (k2, b) in zip(model.state_dict().items(), again.state_dict().items()):
        assert k == k2 and torch.equal(a, b)


# ----------------------------------------------------------------------------- all or nothing


def snapshot(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("flaw", ["last_key_misshaped", "last_key_nan", "one_missing", "one_extra"])
def test_failed_load_leaves_the_model_untouched(tiny, flaw):
    """Every other tensor in the bad state dict is valid and different: a loader that copied
    key by key before failing would leave a half-loaded model behind."""
    _, model, _ = tiny
    before = snapshot(model)
    sd = {k: torch.randn_like(v) for k, v in before.items()}
    last = list(sd)[-1]
    if flaw == "last_key_misshaped":
        sd[last] = torch.zeros(sd[last].numel() + 1)
    elif flaw == "last_key_nan":
        sd[last][0] = float("nan")
    elif flaw == "one_missing":
        del sd[last]
    else:
        sd["blocks.0.attn.extra"] = torch.zeros(1)
    with pytest.raises(CheckpointError) as ei:
        load_state_dict_strict(model, sd, source="bad")
    assert last in str(ei.value) or "blocks.0.attn.extra" in str(ei.value)
    after = snapshot(model)
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_successful_strict_load_copies_everything(tiny):
    _, model, _ = tiny
    before = snapshot(model)
    try:
        sd = {k: torch.randn_like(v) for k, v in before.items()}
        load_state_dict_strict(model, sd)
        assert all(torch.equal(sd[k], v) for k, v in model.state_dict().items())
    finally:
        load_state_dict_strict(model, before)  # the fixture is shared


# ----------------------------------------------------------------------------- forged configs


def forged(tmp_path, config, data_config="{}") -> Path:
    p = tmp_path / "forged.safetensors"
    save_file({"head.weight": torch.zeros(2, 2)}, str(p),
              metadata={"format": port.FORMAT_TAG, "config": config, "data_config": data_config})
    return p


@pytest.mark.parametrize("config", ["{not json", "null", '{"bogus": 1}', '{"embed_dim": 8, "num_heads": 3}',
                                    '{"patch_size": 0}', '{"embed_dim": -64, "num_heads": 4}'])
def test_unreadable_stored_config(tmp_path, config):
    with pytest.raises(CheckpointError) as ei:
        from_checkpoint(forged(tmp_path, config))
    assert one_line(ei).startswith("forged.safetensors: its stored config is unreadable or invalid")


def test_bad_stored_data_config(tmp_path):
    with pytest.raises(CheckpointError, match="interpolation"):
        from_checkpoint(forged(tmp_path, "{}", json.dumps({"interpolation": "sinc"})))


def test_forged_giant_config_is_refused_before_any_allocation(tmp_path, monkeypatch):
    """A vit_demo file whose config declares a 4096-wide, 48-block model (9.7 B parameters,
    39 GB) but holds one tiny tensor: refused from shapes alone, no real model is built."""
    built = []
    real_vit = port.VisionTransformer

    def spy(cfg):
        m = real_vit(cfg)
        built.append(next(m.parameters()).device.type)
        return m

    monkeypatch.setattr(port, "VisionTransformer", spy)
    cfg = json.dumps({"embed_dim": 4096, "num_heads": 8, "depth": 48})
    t = time.perf_counter()
    with pytest.raises(CheckpointError, match="does not fit this architecture"):
        from_checkpoint(forged(tmp_path, cfg))
    assert time.perf_counter() - t < 20
    assert built == ["meta"]
