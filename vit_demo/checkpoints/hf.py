"""Hugging Face transformers vision-model folders -> the from-scratch ViT.

A transformers model folder holds ``config.json`` (the architecture, ``id2label``), the weights
(``model.safetensors``, sharded ``model-0000x-of-0000n.safetensors`` with an index, or
``pytorch_model.bin``) and, usually, ``preprocessor_config.json`` (the image processor). These
model classes map onto this project's ViT exactly:

- ``ViTForImageClassification``: [class] token, ``classifier`` head;
- ``ViTModel``: headless (the output is the normed [class] token; the optional ``pooler``,
  a dense + tanh layer no classifier uses, is left out and named in the metadata);
- ``DeiTForImageClassificationWithTeacher``: [class] + [dist] tokens, two heads averaged;
- ``Dinov2Model`` (LayerScale, optional packed SwiGLU) and ``Dinov2WithRegistersModel``
  (register tokens; the [class] token's position is folded into the token, as timm does):
  headless, the output is the normed [class] token (``pooler_output``);
- ``CLIPVisionModel`` (pre-norm, QuickGELU; the output is the normed [class] token) and
  ``CLIPVisionModelWithProjection`` (plus the projection without bias: ``image_embeds``);
- ``SiglipVisionModel``: no [class] token, GELU-tanh, the attention-pool head (``pooler_output``).

Porting is strict as for timm: every key is mapped or named as dropped, every shape is checked
(``port.check_state_dict``), and a config this model cannot reproduce is refused with the
settings named. Nothing here imports transformers: a ``.safetensors`` folder ports without it,
and ``.bin`` files are read with ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import torch

from ..model import VisionTransformer, ViTConfig
from ..preprocess import IMAGENET_MEAN, IMAGENET_STD, DataConfig
from .files import CheckpointError, UnsupportedModelError, check_state_dict, read_checkpoint

SUPPORTED = ("ViTForImageClassification", "ViTModel", "DeiTForImageClassificationWithTeacher", "Dinov2Model",
             "Dinov2WithRegistersModel", "CLIPVisionModel", "CLIPVisionModelWithProjection", "SiglipVisionModel")
HEADLESS = ("ViTModel", "Dinov2Model", "Dinov2WithRegistersModel", "CLIPVisionModel", "SiglipVisionModel")
ACTIVATIONS = {"gelu": "gelu", "quick_gelu": "quick_gelu",  # transformers' "gelu" is the exact erf GELU
               "gelu_pytorch_tanh": "gelu_tanh"}
DEFAULT_EPS = {"Dinov2": 1e-6, "CLIP": 1e-5, "Siglip": 1e-6}  # by class-name prefix; ViT / DeiT: 1e-12
# PIL's resampling codes, as image processors store them
PIL_RESAMPLE = {0: "nearest", 1: "lanczos", 2: "bilinear", 3: "bicubic", 4: "box", 5: "hamming"}
CLIP_STATS = ((0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711))  # OpenAI CLIP's mean, std
META_ARCHITECTURE = "hf_architecture"  # safetensors metadata: the transformers class a file came from


def is_hf_folder(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a folder with a transformers ``config.json``."""
    return Path(path).is_dir() and (Path(path) / "config.json").is_file()


def read_json(path: Path) -> dict[str, Any]:
    try:
        d = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{path}: cannot read it as JSON ({e})") from e
    if not isinstance(d, dict):
        raise CheckpointError(f"{path}: expected a JSON object")
    return d


def architecture_of(hf: dict[str, Any], folder: Path) -> str:
    """The transformers class named in ``config.json``'s ``architectures``; refused unless supported."""
    archs = hf.get("architectures") or []
    arch = archs[0] if archs else None
    if arch not in SUPPORTED:
        raise UnsupportedModelError(
            f"{folder}: config.json describes {arch or 'no architecture'} (model_type "
            f"{hf.get('model_type')!r}); supported: {', '.join(SUPPORTED)}"
        )
    return arch


def _pair(v: Any, what: str) -> tuple[int, int]:
    if isinstance(v, int):
        return v, v
    if isinstance(v, (list, tuple)) and len(v) == 2 and all(isinstance(i, int) for i in v):
        return int(v[0]), int(v[1])
    raise UnsupportedModelError(f"config.json: {what}={v!r} is not an int or a pair of ints")


def vit_config_from_hf(hf: dict[str, Any], arch: str, num_classes: int, sd: dict[str, torch.Tensor] | None = None
                       ) -> ViTConfig:
    """The architecture from ``config.json`` (and, for a SwiGLU's width, the weights ``sd``).
    Raises UnsupportedModelError naming every setting this ViT cannot reproduce."""
    problems = []
    act = hf.get("hidden_act", "gelu")
    if act not in ACTIVATIONS:
        problems.append(f"hidden_act={act!r} (supported: {', '.join(ACTIVATIONS)})")
    ph, pw = _pair(hf.get("patch_size", 16), "patch_size")
    h, w = _pair(hf.get("image_size", 224), "image_size")
    if ph != pw:
        problems.append(f"non-square patch_size={hf.get('patch_size')!r}")
    if h % ph or w % pw:
        problems.append(f"image_size {h}x{w} is not a multiple of patch_size {ph}")
    hidden, heads = hf.get("hidden_size", 768), hf.get("num_attention_heads", 12)
    if hidden % heads:
        problems.append(f"hidden_size {hidden} not divisible by num_attention_heads {heads}")
    for key in ("use_absolute_position_embeddings", "use_relative_position_bias", "use_shared_relative_position_bias"):
        if key in hf and bool(hf[key]) != (key == "use_absolute_position_embeddings"):
            problems.append(f"{key}={hf[key]!r}")
    family = _family_fields(hf, arch, hidden, sd or {}, problems)
    if problems:
        raise UnsupportedModelError(f"{arch}: not a ViT this project implements: " + ", ".join(problems))
    eps = next((v for k, v in DEFAULT_EPS.items() if arch.startswith(k)), 1e-12)
    base = dict(
        img_size=(h, w), patch_size=ph, in_chans=int(hf.get("num_channels", 3)), embed_dim=int(hidden),
        depth=int(hf.get("num_hidden_layers", 12)), num_heads=int(heads),
        mlp_ratio=hf.get("intermediate_size", 4 * hidden) / hidden, norm_eps=float(hf.get("layer_norm_eps", eps)),
        act=ACTIVATIONS.get(act, "gelu"), global_pool="token", num_classes=num_classes,
        pos_embed_antialias=False,  # transformers' interpolate_pos_encoding: plain bicubic
    )
    return ViTConfig(**{**base, **family})


def _family_fields(hf: dict[str, Any], arch: str, hidden: int, sd: dict[str, torch.Tensor], problems: list[str]
                   ) -> dict[str, Any]:
    """What sets each transformers family apart from the plain ViT."""
    if arch.startswith(("ViT", "DeiT")):
        return dict(qkv_bias=bool(hf.get("qkv_bias", True)), dist_token=arch.startswith("DeiT"))
    if arch.startswith("Dinov2"):
        regs = int(hf.get("num_register_tokens", 0)) if arch == "Dinov2WithRegistersModel" else 0
        out: dict[str, Any] = dict(qkv_bias=bool(hf.get("qkv_bias", True)), layer_scale=True, reg_tokens=regs,
                                   no_embed_class=regs > 0, mlp_ratio=float(hf.get("mlp_ratio", 4)),
                                   pos_embed_antialias=regs > 0)  # the registers model interpolates with antialias
        if hf.get("use_swiglu_ffn"):  # packed: weights_in = [gate; value]
            fc1 = sd.get("blocks.0.mlp.fc1.weight")
            out.update(mlp="glu", act="silu", mlp_hidden_dim=fc1.shape[0] // 2 if fc1 is not None else 0)
        return out
    if arch.startswith("CLIP"):
        return dict(pre_norm=True, patch_bias=False, head_bias=False)
    if not hf.get("vision_use_head", True):  # SigLIP
        problems.append("vision_use_head=false (no attention-pool head: its output is the token sequence)")
    return dict(class_token=False, global_pool="map", map_mlp_hidden=int(hf.get("intermediate_size", 4 * hidden)))


def data_config_from_hf(folder: Path, hf: dict[str, Any], arch: str, img_size: tuple[int, int]) -> DataConfig:
    """The image processor's resize / crop / normalisation (``preprocessor_config.json``), else
    the defaults of ViTImageProcessor (squash to the size, bilinear, mean = std = 0.5) or
    DeiTImageProcessor (256 then a 224 crop, bicubic, ImageNet mean/std), with the statistics
    DINOv2 (ImageNet's), CLIP (OpenAI's) and SigLIP (0.5) were trained with."""
    p = folder / "preprocessor_config.json"
    pc = read_json(p) if p.is_file() else {}
    deit = arch.startswith("DeiT")
    stats = {"DeiT": (IMAGENET_MEAN, IMAGENET_STD), "Dinov2": (IMAGENET_MEAN, IMAGENET_STD), "CLIP": CLIP_STATS}
    default_mean, default_std = next((v for k, v in stats.items() if arch.startswith(k)), ((0.5,) * 3, (0.5,) * 3))
    mean = tuple(pc.get("image_mean", default_mean))
    std = tuple(pc.get("image_std", default_std))
    if pc.get("do_normalize") is False:
        mean, std = (0.0, 0.0, 0.0), (1.0, 1.0, 1.0)
    interpolation = PIL_RESAMPLE.get(pc.get("resample", 3 if deit else 2), "bilinear")

    size = pc.get("size")
    if isinstance(size, dict) and "shortest_edge" in size:  # resize keeping the aspect ratio, then crop
        short = int(size["shortest_edge"])
        crop = _hw(pc.get("crop_size"), (short, short)) if pc.get("do_center_crop") else (short, short)
        return DataConfig(input_size=crop, interpolation=interpolation, crop_pct=min(1.0, crop[0] / short),
                          crop_mode="center", mean=mean, std=std)
    if pc:
        resize = _hw(size, img_size)
        crop = _hw(pc.get("crop_size"), resize) if pc.get("do_center_crop") else resize
    elif deit:  # DeiTImageProcessor: 256 -> 224 at 224 px, scaled alike at other sizes
        crop = img_size
        resize = (img_size[0] * 256 // 224, img_size[1] * 256 // 224)
    else:
        resize = crop = img_size
    # stretch to `resize` (the aspect ratio is not kept), then a center crop to `crop`
    return DataConfig(input_size=crop, interpolation=interpolation, crop_pct=min(1.0, crop[0] / resize[0]),
                      crop_mode="squash", mean=mean, std=std)


def _hw(d: Any, default: tuple[int, int]) -> tuple[int, int]:
    """An image processor's size entry as (height, width)."""
    if isinstance(d, dict) and "height" in d and "width" in d:
        return int(d["height"]), int(d["width"])
    if isinstance(d, int):
        return d, d
    return default


def class_names_from_hf(hf: dict[str, Any], num_classes: int) -> tuple[str, ...] | None:
    """``id2label`` as a tuple, or None when it is transformers' placeholder (``LABEL_i``)."""
    raw = hf.get("id2label") or {}
    try:
        names = {int(k): str(v) for k, v in raw.items()}
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"config.json: id2label has a non-integer key ({e})") from e
    if num_classes == 0 or sorted(names) != list(range(num_classes)):
        return None
    out = tuple(names[i] for i in range(num_classes))
    return None if all(n == f"LABEL_{i}" for i, n in enumerate(out)) else out


def read_hf_weights(folder: Path) -> tuple[dict[str, torch.Tensor], str]:
    """The folder's tensors and the file(s) they came from: model.safetensors, a sharded
    safetensors index, or pytorch_model.bin (weights-only unpickling)."""
    single, index, binf = folder / "model.safetensors", folder / "model.safetensors.index.json", folder / "pytorch_model.bin"
    if single.is_file():
        return read_checkpoint(single)[0], single.name
    if index.is_file():
        shards = sorted(set(read_json(index).get("weight_map", {}).values()))
        if not shards or any("/" in s or "\\" in s for s in shards):
            raise CheckpointError(f"{index}: no usable weight_map")
        sd: dict[str, torch.Tensor] = {}
        for s in shards:
            sd.update(read_checkpoint(folder / s)[0])
        return sd, f"{len(shards)} safetensors shards"
    if binf.is_file():
        return read_checkpoint(binf)[0], binf.name
    raise CheckpointError(f"{folder}: no model.safetensors, model.safetensors.index.json or pytorch_model.bin")


_PREFIX = re.compile(r"^(vit|deit|vision_model)\.")
_LAYER = re.compile(r"^(?:encoder\.layers?|layers)\.(\d+)\.(.+)$")
_QKV = {  # a block's q, k and v projections, concatenated into qkv
    "attention.attention.query": "q", "attention.attention.key": "k", "attention.attention.value": "v",  # ViT, DINOv2
    "attention.q_proj": "q", "attention.k_proj": "k", "attention.v_proj": "v",  # the same, newer names
    "self_attn.q_proj": "q", "self_attn.k_proj": "k", "self_attn.v_proj": "v",  # CLIP, SigLIP
}
_BLOCK_PARTS = {
    "attention.output.dense": "attn.proj", "attention.o_proj": "attn.proj", "self_attn.out_proj": "attn.proj",
    "intermediate.dense": "mlp.fc1", "output.dense": "mlp.fc2",  # ViT / DeiT
    "mlp.fc1": "mlp.fc1", "mlp.fc2": "mlp.fc2", "mlp.weights_in": "mlp.fc1", "mlp.weights_out": "mlp.fc2",  # DINOv2 ...
    "layernorm_before": "norm1", "layernorm_after": "norm2", "norm1": "norm1", "norm2": "norm2",
    "layer_norm1": "norm1", "layer_norm2": "norm2", "layer_scale1": "ls1", "layer_scale2": "ls2",
}
_PARAMS = {"lambda1": "gamma"}  # DINOv2's LayerScale
_TOP = {
    "embeddings.cls_token": "cls_token",
    "embeddings.class_embedding": "cls_token",  # CLIP: [C]
    "embeddings.distillation_token": "dist_token",
    "embeddings.register_tokens": "reg_token",
    "embeddings.position_embeddings": "pos_embed",
    "embeddings.position_embedding.weight": "pos_embed",  # CLIP, SigLIP: an nn.Embedding [N, C]
    "embeddings.patch_embeddings.projection.weight": "patch_embed.proj.weight",
    "embeddings.patch_embeddings.projection.bias": "patch_embed.proj.bias",
    "embeddings.patch_embedding.weight": "patch_embed.proj.weight",
    "embeddings.patch_embedding.bias": "patch_embed.proj.bias",
    "layernorm.weight": "norm.weight", "layernorm.bias": "norm.bias",
    "pre_layrnorm.weight": "norm_pre.weight", "pre_layrnorm.bias": "norm_pre.bias",  # (sic: transformers' name)
    "post_layernorm.weight": "norm.weight", "post_layernorm.bias": "norm.bias",
    "visual_projection.weight": "head.weight",
    "head.probe": "attn_pool.latent",  # SigLIP's attention-pool head
    "head.attention.out_proj.weight": "attn_pool.proj.weight", "head.attention.out_proj.bias": "attn_pool.proj.bias",
    "head.layernorm.weight": "attn_pool.norm.weight", "head.layernorm.bias": "attn_pool.norm.bias",
    "head.mlp.fc1.weight": "attn_pool.mlp.fc1.weight", "head.mlp.fc1.bias": "attn_pool.mlp.fc1.bias",
    "head.mlp.fc2.weight": "attn_pool.mlp.fc2.weight", "head.mlp.fc2.bias": "attn_pool.mlp.fc2.bias",
}
_SPLIT = {"head.attention.in_proj_weight": "weight", "head.attention.in_proj_bias": "bias"}  # [q; k; v] -> q, kv
_HEADS = {"classifier": "head", "cls_classifier": "head", "distillation_classifier": "head_dist"}
_DROPPED = ("pooler.dense.", "embeddings.mask_token", "embeddings.position_ids")  # not in the forward pass we port


def _top(k: str, v: torch.Tensor, out: dict[str, torch.Tensor]) -> None:
    """A key outside the blocks, in place of its timm-layout name (CLIP's and SigLIP's vectors
    and embedding tables get timm's leading dimensions; SigLIP's in_proj splits into q and kv)."""
    if k in _SPLIT:
        C = v.shape[0] // 3
        out[f"attn_pool.q.{_SPLIT[k]}"], out[f"attn_pool.kv.{_SPLIT[k]}"] = v[:C], v[C:]
    elif k == "embeddings.class_embedding":
        out["cls_token"] = v.reshape(1, 1, -1)
    elif k == "embeddings.position_embedding.weight":
        out["pos_embed"] = v[None]
    else:
        out[_TOP[k]] = v


def convert_state_dict(sd: dict[str, torch.Tensor], source: str) -> tuple[dict[str, torch.Tensor], list[str]]:
    """transformers keys -> this project's (timm's) keys; q, k, v are concatenated into qkv.
    Returns (state dict, dropped keys). Unknown keys raise CheckpointError naming them."""
    out: dict[str, torch.Tensor] = {}
    qkv: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    dropped, unknown = [], []
    for key, v in sd.items():
        k = _PREFIX.sub("", key)
        head = k.split(".")[0]
        if k.startswith(_DROPPED):
            dropped.append(key)
        elif k in _TOP or k in _SPLIT:
            _top(k, v, out)
        elif head in _HEADS and k.count(".") == 1:
            out[f"{_HEADS[head]}.{k.split('.')[1]}"] = v
        elif m := _LAYER.match(k):
            i, rest = int(m.group(1)), m.group(2)
            part, _, param = rest.rpartition(".")
            if part in _QKV:
                qkv.setdefault((i, param), {})[_QKV[part]] = v
            elif part in _BLOCK_PARTS:
                out[f"blocks.{i}.{_BLOCK_PARTS[part]}.{_PARAMS.get(param, param)}"] = v
            else:
                unknown.append(key)
        else:
            unknown.append(key)
    for (i, param), parts in sorted(qkv.items()):
        if set(parts) != {"q", "k", "v"}:
            missing = [name for name, p in (("query", "q"), ("key", "k"), ("value", "v")) if p not in parts]
            raise CheckpointError(f"{source}: layer {i}: attention {param} missing for {', '.join(missing)}")
        out[f"blocks.{i}.attn.qkv.{param}"] = torch.cat([parts["q"], parts["k"], parts["v"]], dim=0)
    if unknown:
        shown = ", ".join(unknown[:12]) + (f", ... ({len(unknown)} in all)" if len(unknown) > 12 else "")
        raise CheckpointError(f"{source}: keys this ViT has no place for: {shown}")
    return out, dropped


def from_hf_folder(folder: str | os.PathLike) -> tuple[VisionTransformer, DataConfig, dict[str, str]]:
    """Port a transformers folder (see the module docstring for the classes). Returns (model, data config, metadata for
    ``port.save``: model_name, source, hf_architecture, class_names, dropped keys)."""
    folder = Path(folder)
    if not is_hf_folder(folder):
        raise CheckpointError(f"{folder}: not a transformers model folder (no config.json)")
    hf = read_json(folder / "config.json")
    arch = architecture_of(hf, folder)
    raw, files = read_hf_weights(folder)
    sd, dropped = convert_state_dict(raw, f"{folder.name}/{files}")
    head = sd.get("head.weight")
    num_classes = 0 if arch in HEADLESS else (head.shape[0] if head is not None else len(hf.get("id2label") or {}))
    cfg = vit_config_from_hf(hf, arch, num_classes, sd)
    if cfg.no_embed_class and "pos_embed" in sd and "cls_token" in sd:  # DINOv2 with registers: [class]'s position
        pos = sd["pos_embed"]  # folded into the token (as timm does), the registers have none
        sd["cls_token"], sd["pos_embed"] = sd["cls_token"] + pos[:, :1], pos[:, 1:]
    with torch.device("meta"):  # shapes only, before any real allocation
        skeleton = VisionTransformer(cfg)
    check_state_dict(skeleton, sd, source=f"{folder.name}/{files}")
    model = VisionTransformer(cfg)
    model.load_state_dict({k: v.to(torch.float32) for k, v in sd.items()}, strict=True)
    dc = data_config_from_hf(folder, hf, arch, cfg.img_size)
    meta = {
        "model_name": hf.get("_name_or_path") or folder.name,
        "source": f"transformers folder {folder} ({files})",
        META_ARCHITECTURE: arch,
    }
    names = class_names_from_hf(hf, num_classes)
    if names is not None:
        meta["class_names"] = json.dumps(list(names))
    if dropped:
        meta["dropped_keys"] = json.dumps(dropped)
    return model.eval(), dc, meta
