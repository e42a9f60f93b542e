"""Pictures of what a ViT looks at: pure renderers, no model calls.

Everything here takes numbers (numpy arrays or torch tensors, already computed by
:mod:`vit_demo.methods`) and pictures (the model-input picture from
:func:`vit_demo.preprocess.preprocess`), and returns either

- a ``PIL.Image`` from the *fast* renderers in :mod:`~vit_demo.viz.previews`
  (:func:`overlay_image`, :func:`heads_image`, :func:`patch_grid_image`, :func:`sequence_image`,
  :func:`stem_image`, :func:`tiles_image`):
  numpy + PIL only, meant for the interactive app where a slider re-renders on every move; or
- a ``matplotlib.figure.Figure`` from the *figure* functions (``*_figure``), for slides and
  papers: pictures of maps in :mod:`~vit_demo.viz.figures`, several images side by side in
  :mod:`~vit_demo.viz.panels`, charts of numbers (curves, bars, tables) in
  :mod:`~vit_demo.viz.charts`; saved with :func:`save_figure` (:mod:`~vit_demo.viz.export`:
  PNG at a chosen pixel width, SVG or PDF).

:mod:`~vit_demo.viz.style` (sizes, colours, colormaps, fonts) and :mod:`~vit_demo.viz.arrays`
(scaling, resampling, patch geometry) are shared by both, and so is :mod:`~vit_demo.viz.sequence`
(which tokens a picture of the token sequence shows). The step-through's pictures (``*_step_image``,
:mod:`~vit_demo.viz.steps`, vit_demo.inside) are fast PIL renderers built from
:mod:`~vit_demo.viz.strips` (numbers as strips, matrices, maps with numbers, bars, charts; a
:class:`Pen` sets their scale). A map's pixels (scaling, colours,
upsampling, blending) are drawn in one place, :func:`overlay_array`: the app's pictures and the
figures' panels of the same map are the same pixels. Every name is re-exported here, so
``from vit_demo.viz import overlay_image`` works whichever module holds it.

Conventions:

- a *map* is a ``[gh, gw]`` array over the patch grid (row-major patch ``i`` sits at row
  ``i // gw``, column ``i % gw``); stacks of maps are ``[H, gh, gw]`` (heads of one layer)
  or ``[L, H, gh, gw]`` (every layer's heads). A leading batch axis of size 1 is dropped.
- Arguments are indices from 0 (``layer=11`` is the last of 12 layers), as in PyTorch and on the
  command line; what a picture SAYS counts layers and heads from 1, as people do ("L12 H1",
  "layer 12 of 12"). Patches keep their index from 0 (the token's position after the prefix).
- Unless ``vmin`` / ``vmax`` are given, every map is shown scaled to *its own* min..max
  (each head panel separately), so the colours show where a map is high, not how high it is
  compared with another map.
- Sizes of PIL pictures are ``(width, height)``, as PIL has them.
"""

from .arrays import Picture, as_array, normalize, patch_index_at, picture_array, upsample
from .export import FIGURE_FORMATS, figure_to_image, render_png, save_figure
from .figures import (
    compare_figure,
    distance_figure,
    heads_figure,
    heatmap_figure,
    input_figure,
    patch_grid_figure,
    pos_embed_figure,
    topk_figure,
    uniform_attention_distance,
)
from .previews import (
    draw_windows,
    heads_image,
    live_picture,
    overlay_array,
    overlay_image,
    patch_grid_image,
    sequence_image,
    stem_image,
    tiles_image,
    with_colorbar,
)
from .sequence import SequenceSlot, sequence_slots
from .steps import (
    attention_step_image,
    lens_step_image,
    logits_step_image,
    mlp_step_image,
    patches_step_image,
    pixels_step_image,
    position_step_image,
    projection_step_image,
    qkv_step_image,
    readout_step_image,
    residual_step_image,
    scores_step_image,
    weighted_sum_step_image,
)
from .strips import Pen
from .style import (
    ACCENT,
    HIGHLIGHT,
    HIGHLIGHT_RGB,
    LABEL_SIZE,
    MUTED_COLOR,
    PANEL_TITLE_SIZE,
    TEXT_COLOR,
    TICK_SIZE,
    TITLE_SIZE,
    TOKEN_COLORS,
    WINDOW_RGB,
    check_cmap,
    colorize,
    colormap_lut,
    text_font,
    text_width,
    token_color,
)

__all__ = [
    "ACCENT", "FIGURE_FORMATS", "HIGHLIGHT", "HIGHLIGHT_RGB", "LABEL_SIZE", "MUTED_COLOR", "PANEL_TITLE_SIZE",
    "TEXT_COLOR", "TICK_SIZE", "TITLE_SIZE", "TOKEN_COLORS", "WINDOW_RGB", "Picture", "SequenceSlot", "as_array",
    "check_cmap", "colorize", "colormap_lut", "compare_figure", "draw_windows", "distance_figure", "figure_to_image",
    "heads_figure", "heads_image", "heatmap_figure", "input_figure", "live_picture", "normalize", "overlay_array",
    "overlay_image",
    "patch_grid_figure", "patch_grid_image", "patch_index_at", "picture_array", "pos_embed_figure", "render_png",
    "save_figure", "sequence_image", "stem_image", "sequence_slots", "text_font", "text_width", "tiles_image",
    "token_color", "topk_figure", "uniform_attention_distance", "upsample", "with_colorbar",
    "Pen", "attention_step_image", "lens_step_image", "logits_step_image", "mlp_step_image", "patches_step_image",
    "pixels_step_image", "position_step_image", "projection_step_image", "qkv_step_image", "readout_step_image",
    "residual_step_image", "scores_step_image", "weighted_sum_step_image",
]
