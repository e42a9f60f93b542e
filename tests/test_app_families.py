"""The app with models of timm's other ViT families: the hub menu offers only architectures the
scratch model ports, and a random-weights EVA-02, DINOv3, SigLIP, relpos ViT and Perception
Encoder each analyse a photo, draw the attention views, a class map (for classifiers) and the
diagnostics, and "Compare with timm" calls them identical."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import timm
import torch
from PIL import Image

from vit_demo import methods
from vit_demo.app.registry import HUB_MODELS, ModelRegistry
from vit_demo.app.sections.models import model_summary
from vit_demo.app.tabs.compare import compare_with_timm
from vit_demo.app.tabs.diagnostics import distance_picture, pos_embed_picture
from vit_demo.checkpoints.timm import config_from_timm
from vit_demo.methods.attention import head_maps
from vit_demo.methods.rollout import rollout
from vit_demo.model import VisionTransformer

FAMILY_MODELS = [
    "eva02_tiny_patch14_224",  # RoPE (rescaled), packed SwiGLU, classifier
    "vit_small_patch16_dinov3",  # DINOv3 RoPE, registers, no absolute position, headless
    "vit_base_patch32_siglip_256",  # attention-pool head, no [class], headless
    "vit_relpos_small_patch16_224",  # relative-position MLP only, classifier
    "vit_pe_core_tiny_patch16_384",  # attention pool over [class] too, RoPE, projection head
]


def test_hub_menu_offers_only_portable_models() -> None:
    """Every hub entry is an architecture config_from_timm accepts, whose scratch model has
    timm's keys and shapes (checked on the meta device: nothing is downloaded or allocated)."""
    assert len(HUB_MODELS) == len(set(HUB_MODELS)) >= 14
    for name in HUB_MODELS:
        assert timm.list_pretrained(name if "." in name else f"{name}.*"), f"{name}: no pretrained weights in timm"
        with torch.device("meta"):
            tm = timm.create_model(name, pretrained=False)
            ours = VisionTransformer(config_from_timm(tm))
        assert {k: v.shape for k, v in ours.state_dict().items()} == {k: v.shape for k, v in tm.state_dict().items()}


def test_offline_hub_pick_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    reg = ModelRegistry(hub_names=("vit_small_patch16_dinov3.lvd1689m",), random_names=())
    key = "hub:vit_small_patch16_dinov3.lvd1689m"
    assert reg.needs_download(key)
    with pytest.raises(ValueError, match="hub is not reachable.*Use your own checkpoint"):  # the page's advice, not the CLI's
        reg.get(key)


@pytest.mark.slow  # a family model through every tab
@pytest.mark.parametrize("name", FAMILY_MODELS)
def test_family_model_in_the_app(name: str, package_photos: dict[str, Path]) -> None:
    reg = ModelRegistry(hub_names=(), random_names=(name,))
    key = f"random:{name}"
    a = reg.analyze(key, Image.open(package_photos["chelsea"]))
    lm = reg.get(key)
    assert a.depth == lm.model.cfg.depth and a.layout.grid == lm.model.cfg.grid_size
    maps = [head_maps(a.attentions, a.layout, a.depth - 1)[0], rollout(a.attentions, a.layout)[0]]
    if lm.model.cfg.num_classes:  # a class map (every method on every family: test_methods_contract.py)
        maps.append(methods.get("chefer")(lm.model, a.x, a.top1)[0])
    for m in maps:
        assert m.shape[-2:] == a.layout.grid and torch.isfinite(m).all()
    for picture in (distance_picture(a, 600), pos_embed_picture(lm, 600)):
        assert picture.width == 600 and np.asarray(picture).std() > 0
    summary = model_summary(lm)
    assert lm.model.cfg.variants() and all(v in summary for v in lm.model.cfg.variants()), summary
    c = compare_with_timm(a, lm, reg.timm_twin(key))
    assert c["identical"], c["verdict"]
    assert len(c["layer_attn_max_diff"]) == lm.model.cfg.depth
