"""Where weights come from, and the proof that they are read right.

- :mod:`.files`: reading checkpoint files, strict key-and-shape checks, the project's own format;
- :mod:`.timm`: timm models and timm-layout files -> the scratch model; the hub;
- :mod:`.timm_arch`: the architecture read off a timm instance (every family; refusals named);
- :mod:`.hf`: Hugging Face transformers folders (ViT, DeiT, DINOv2, CLIP, SigLIP) -> the scratch model;
- :mod:`.load`: :func:`~.load.load_model` (a file, ``weights/``, random init or the hub) and
  :class:`~.load.LoadedModel`;
- :mod:`.verify`: the scratch model against timm's (or transformers') on the same weights.
"""
