"""The plain ViT stands alone (issue 42): ``vit_demo/model/vit.py`` and ``config.py``, copied into an
empty package and imported by a Python that cannot import vit_demo, build DeiT-Tiny, load the
shipped weights strictly (timm's layout) and give timm's logits on a real photo within 1e-4, with
every layer's attention captured; a family's config fails there in one line that names the family's
module. And vit.py stays one page that imports nothing of the project but its config."""

from __future__ import annotations

import ast
import json
import shutil
import site
import subprocess
import sys
from pathlib import Path

import pytest

MODEL = Path(__file__).resolve().parents[1] / "vit_demo" / "model"

CHILD = r"""
import importlib.util, json, sys
sys.path[:0] = json.loads(sys.argv[1])  # the package's folder, then site-packages: nothing of the repo
assert importlib.util.find_spec("vit_demo") is None, "vit_demo is importable"
import timm, timm.data, torch
from PIL import Image
from safetensors.torch import load_file
from somepkg.config import ViTConfig
from somepkg.vit import VisionTransformer

torch.set_num_threads(2)
weights, photo = sys.argv[2], sys.argv[3]
sd = load_file(weights)
model = VisionTransformer(ViTConfig(embed_dim=192, depth=12, num_heads=3)).eval()
model.load_state_dict(sd, strict=True)
tm = timm.create_model("deit_tiny_patch16_224", pretrained=False).eval()
tm.load_state_dict(sd, strict=True)
x = timm.data.create_transform(**timm.data.resolve_data_config({}, model=tm))(Image.open(photo).convert("RGB"))[None]
seen = []  # the scores at the first block's hook point: formed only where the softmax is explicit (capture)
hook = model.blocks[0].attn.hook_scores.register_forward_hook(lambda m, a, out: seen.append(out.clone()))
with torch.no_grad():
    ours, ref, captured = model(x).logits, tm(x), model(x, capture=True)
hook.remove()
try:
    VisionTransformer(ViTConfig(embed_dim=192, depth=12, num_heads=3, rope="axial"))
    refusal = None
except ValueError as e:
    refusal = str(e)
print(json.dumps({
    "modules": sorted(m for m in sys.modules if m.split(".")[0] in ("vit_demo", "somepkg")),
    "diff": (ours - ref).abs().max().item(), "captured_diff": (captured.logits - ref).abs().max().item(),
    "top1": [int(ours.argmax()), int(ref.argmax())], "layers": len(captured.attentions),
    "shape": list(captured.attentions[0].shape), "row_sums": captured.attentions[-1].sum(-1).flatten().tolist()[:5],
    "refusal": refusal, "scores_seen": len(seen),
    "softmax_of_scores": (seen[0].softmax(-1) - captured.attentions[0]).abs().max().item(),
}))
"""


@pytest.mark.slow  # a fresh interpreter
def test_vit_and_config_alone_load_deit_tiny_and_match_timm(tmp_path: Path, deit_tiny_path: Path,
                                                           package_photos: dict[str, Path]) -> None:
    pkg = tmp_path / "somepkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    for name in ("vit.py", "config.py"):
        shutil.copy(MODEL / name, pkg / name)
    paths = [str(tmp_path), *site.getsitepackages()]  # -S: no .pth file runs, so no editable install of vit_demo
    run = subprocess.run([sys.executable, "-I", "-S", "-c", CHILD, json.dumps(paths), str(deit_tiny_path),
                          str(package_photos["chelsea"])], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["modules"] == ["somepkg", "somepkg.config", "somepkg.vit"]
    assert out["diff"] <= 1e-4 and out["captured_diff"] <= 1e-4, out
    assert out["top1"][0] == out["top1"][1] in (281, 282, 285)  # a cat: tabby, tiger cat, Egyptian cat (conftest)
    assert out["layers"] == 12 and out["shape"] == [1, 3, 197, 197]
    assert all(abs(s - 1) < 1e-5 for s in out["row_sums"])
    assert out["scores_seen"] == 1 and out["softmax_of_scores"] <= 1e-6
    assert out["refusal"] == ("ViTConfig(rope='axial') needs the rotary position family: import vit_demo.model "
                              "(or vit_demo.model.rope) to register it")


def test_vit_py_is_one_page_that_imports_only_its_config() -> None:
    """One page read in order: the first layer within 70 lines, the layers before the model, the
    registry after it; the plain attention takes only what it uses (the tokens, the capture flag)."""
    source = (MODEL / "vit.py").read_text()
    assert len(source.splitlines()) <= 400
    tree = ast.parse(source)
    line = {n.name: n.lineno for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef))}
    line |= {n.target.id: n.lineno for n in tree.body if isinstance(n, ast.AnnAssign)}
    modules = [n for n in tree.body if isinstance(n, ast.ClassDef) and "nn.Module" in map(ast.unparse, n.bases)]
    assert modules[0].name == "PatchEmbed" and line["PatchEmbed"] <= 70
    assert line["PatchEmbed"] < line["SelfAttention"] < line["Mlp"] < line["Block"] < line["VisionTransformer"] < line["PARTS"]
    attention = next(n for n in modules if n.name == "SelfAttention")
    forward = next(f for f in attention.body if isinstance(f, ast.FunctionDef) and f.name == "forward")
    assert [a.arg for a in forward.args.args] == ["self", "x", "capture"]
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            imported.add("." * node.level + (node.module or ""))
        elif isinstance(node, ast.Import):
            imported.update(a.name for a in node.names)
    assert imported == {"__future__", "collections.abc", "typing", "torch", "torch.nn.functional", ".config"}


def test_a_registered_attention_is_picked_and_lrp_finds_it_by_its_attribute(monkeypatch) -> None:
    """A family's attention class, of no class LRP knows, is built where the registry says and
    gets LRP's rule because it carries ``relevance = "attention"``; the rule shapes its gradients."""
    import torch
    from torch import nn

    from vit_demo.methods.lrp import CP_LRP, cp_attention, explanation_mode
    from vit_demo.model import PARTS, VisionTransformer, ViTConfig

    class Tagged(nn.Module):  # single-head attention written out, no subclass of the model's Attention
        relevance = "attention"
        relevance_rule = None

        def __init__(self, cfg: ViTConfig, index: int = 0) -> None:
            super().__init__()
            self.qkv, self.proj = nn.Linear(cfg.embed_dim, 3 * cfg.embed_dim), nn.Linear(cfg.embed_dim, cfg.embed_dim)
            self.attend = PARTS["kernel"]["attend"]

        def forward(self, x, capture=False):
            q, k, v = self.qkv(x)[:, None].chunk(3, dim=-1)  # [B, 1, N, C]
            o, attn = self.attend(q, k, v, x.shape[-1] ** -0.5, capture, None, self.relevance_rule)
            return self.proj(o[:, 0]), attn

    monkeypatch.setitem(PARTS["attention"], "", Tagged)
    torch.manual_seed(0)
    model = VisionTransformer(ViTConfig(img_size=(32, 32), patch_size=8, embed_dim=16, depth=2, num_heads=1,
                                        num_classes=3)).eval()
    assert all(type(b.attn) is Tagged for b in model.blocks)
    x = torch.randn(1, 3, 32, 32, requires_grad=True)
    plain = torch.autograd.grad(model(x).logits[0, 0], x)[0]
    with explanation_mode(model, CP_LRP):
        assert all(b.attn.relevance_rule is cp_attention for b in model.blocks)
        ruled = torch.autograd.grad(model(x).logits[0, 0], x)[0]
    assert all(b.attn.relevance_rule is None for b in model.blocks)
    assert not torch.allclose(plain, ruled)
