"""timm models <-> the from-scratch ViT: the config read off a timm instance (:mod:`.timm_arch`),
its weights copied over (strictly, :mod:`.files`), timm's pretrained weights from the hub (only when it is
reachable, failing fast otherwise), and timm-layout checkpoint files.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..model import VisionTransformer, ViTConfig
from ..preprocess import DataConfig
from .files import CheckpointError, UnsupportedModelError, is_timm_layout, load_state_dict_strict
from .timm_arch import config_from_timm

__all__ = ["config_from_timm", "from_timm", "from_hub", "from_timm_file", "timm_model", "scratch_keys", "timm_keys"]

HUB_HOST = ("huggingface.co", 443)


# ----------------------------------------------------------------------------- timm -> scratch


def data_config_from_timm(tm: nn.Module) -> DataConfig:
    """The eval preprocessing timm resolves for this model's pretrained config."""
    from timm.data import resolve_data_config

    return DataConfig.from_timm(resolve_data_config({}, model=tm))


NAFLEX_NAMES = (("embeds.proj.", "patch_embed.proj."), ("embeds.norm.", "patch_embed.norm."), ("embeds.", ""))


def scratch_keys(sd: dict[str, torch.Tensor], cfg: ViTConfig) -> dict[str, torch.Tensor]:
    """timm's state-dict names as the scratch model's: the same, but for NaFlexViT, whose
    embedding lives under ``embeds.`` (``embeds.proj`` -> ``patch_embed.proj``, ``embeds.pos_embed``
    -> ``pos_embed``, ...); nothing else changes, shapes included."""
    if not cfg.naflex:
        return sd
    return {next((new + k[len(old):] for old, new in NAFLEX_NAMES if k.startswith(old)), k): v for k, v in sd.items()}


def timm_keys(sd: dict[str, torch.Tensor], cfg: ViTConfig) -> dict[str, torch.Tensor]:
    """The scratch model's state-dict names as timm's (the inverse of :func:`scratch_keys`)."""
    if not cfg.naflex:
        return sd
    top = ("cls_token", "reg_token", "pos_embed", "pos_embed_y", "pos_embed_x")
    back = {k: ("embeds." + k if k in top else "embeds." + k[len("patch_embed."):] if k.startswith("patch_embed.") else k)
            for k in sd}
    return {back[k]: v for k, v in sd.items()}


def from_timm(tm: nn.Module) -> tuple[VisionTransformer, DataConfig]:
    """A scratch model with the architecture and weights of a timm ViT instance."""
    cfg = config_from_timm(tm)
    model = VisionTransformer(cfg)
    load_state_dict_strict(model, scratch_keys(tm.state_dict(), cfg), source=cfg_name(tm))
    return model.eval(), data_config_from_timm(tm)


def cfg_name(tm: nn.Module) -> str:
    pc = getattr(tm, "pretrained_cfg", None) or {}
    arch, tag = pc.get("architecture"), pc.get("tag")
    return f"{arch}.{tag}" if arch and tag else (arch or type(tm).__name__)


# ----------------------------------------------------------------------------- timm models


def timm_model(name: str, pretrained: bool = False, **kwargs: Any) -> nn.Module:
    """A timm model by name (architecture only unless ``pretrained``)."""
    import timm

    try:
        return timm.create_model(name, pretrained=pretrained, **kwargs).eval()
    except RuntimeError as e:
        if "Unknown model" in str(e):
            raise UnsupportedModelError(f"timm does not know a model named {name!r}") from e
        raise


def hub_address() -> tuple[str, int]:
    """Host and port of the Hugging Face hub, honouring ``$HF_ENDPOINT`` (a mirror or a test server)."""
    from urllib.parse import urlsplit

    url = urlsplit(os.environ.get("HF_ENDPOINT", "").strip() or "https://huggingface.co")
    try:
        port = url.port
    except ValueError:
        port = None
    return url.hostname or HUB_HOST[0], port or (80 if url.scheme == "http" else 443)


def hub_reachable() -> bool:
    """Whether the Hugging Face hub ($HF_ENDPOINT or huggingface.co) answers a TCP connect
    within 3 s (no retries)."""
    if os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes", "on"):
        return False
    host, port = hub_address()
    try:
        socket.getaddrinfo(host, port)  # fails fast with no DNS
        with socket.create_connection((host, port), timeout=3.0):
            return True
    except OSError:
        return False


class HubUnavailableError(RuntimeError):
    """Pretrained weights were asked for by name and the hub cannot be reached."""


def from_hub(name: str, progress: bool = True) -> tuple[VisionTransformer, DataConfig]:
    """Download ``name``'s pretrained weights with timm (into the Hugging Face cache, with a
    progress bar on stderr unless ``progress`` is False) and port them. Fails within seconds
    when the hub is unreachable, telling the user how to use a local file instead."""
    t0 = time.perf_counter()
    if not hub_reachable():
        raise HubUnavailableError(
            f"cannot download pretrained weights for {name!r}: the model hub is not reachable "
            f"(checked in {time.perf_counter() - t0:.1f} s; offline or HF_HUB_OFFLINE=1). "
            f"Give a local checkpoint instead: --weights FILE (a timm state_dict as .safetensors, "
            f".pth/.bin or .npz), or put one in weights/ (see weights/README.md)."
        )
    from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars

    was_disabled = are_progress_bars_disabled()
    (enable_progress_bars if progress else disable_progress_bars)()
    try:
        tm = timm_model(name, pretrained=True)
    except UnsupportedModelError:
        raise
    except Exception as e:  # huggingface_hub / HTTP / file errors: the hub answered, but not with weights
        host, port = hub_address()
        why = str(e).strip().split("\n")[0][:300] or type(e).__name__
        raise HubUnavailableError(
            f"cannot download pretrained weights for {name!r} from the hub ({host}:{port}): {why}"
        ) from e
    finally:
        (disable_progress_bars if was_disabled else enable_progress_bars)()
    return from_timm(tm)


def from_timm_file(path: Path, sd: dict[str, torch.Tensor], model_name: str | None
                   ) -> tuple[VisionTransformer, DataConfig, dict[str, str]]:
    """A timm-layout checkpoint (``sd`` read from ``path``) into a scratch model. Its architecture
    is ``model_name``, or the file's stem when that is a timm name (``deit_tiny_patch16_224.safetensors``)."""
    name = model_name or timm_name_from_stem(path)
    if name is None:
        raise CheckpointError(
            f"{path.name}: a timm-layout checkpoint needs the architecture: pass --model NAME "
            f"(a timm model name such as deit_tiny_patch16_224)"
        )
    tm = timm_model(name)
    if path.suffix.lower() == ".npz" and not is_timm_layout(sd):  # big_vision / JAX layout
        from timm.models.vision_transformer import _load_weights

        _load_weights(tm, str(path))
        model, dc = from_timm(tm)
        return model, dc, {"model_name": name, "source": path.name}
    cfg = config_from_timm(tm)
    model = VisionTransformer(cfg)
    load_state_dict_strict(model, scratch_keys(sd, cfg), source=path.name)
    return model.eval(), data_config_from_timm(tm), {"model_name": name, "source": path.name}


def timm_name_from_stem(path: Path) -> str | None:
    try:
        import timm
    except ImportError:
        return None
    stem = path.name.split(".safetensors")[0].split(".pth")[0].split(".bin")[0].split(".npz")[0]
    base = stem.split(".")[0]
    return stem if timm.is_model(stem) else (base if timm.is_model(base) else None)

