"""Fast renderers for the interactive app: numpy + PIL only, a few milliseconds each, so a
slider can re-render on every move. Each returns an RGB ``PIL.Image``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

import numpy as np
from PIL import Image, ImageDraw

from .arrays import Picture, as_maps, blend, normalize, patch_box, picture_array, resized_picture, target_size, upsample
from .sequence import sequence_slots
from .style import HIGHLIGHT_RGB, WINDOW_RGB, colorize, text_font, text_width, token_color


def _outline(draw: ImageDraw.ImageDraw, box: tuple[float, float, float, float], width: int) -> None:
    """A cyan box with a thin dark rim, visible on any background."""
    x0, y0, x1, y1 = (round(v) for v in box)
    draw.rectangle((x0, y0, x1 - 1, y1 - 1), outline=(0, 0, 0), width=width + 2)
    draw.rectangle((x0 + 1, y0 + 1, x1 - 2, y1 - 2), outline=HIGHLIGHT_RGB, width=width)


def overlay_array(
    picture: Picture | None,
    maps: Any,
    cmap: str = "inferno",
    alpha: float = 0.6,
    smooth: bool = True,
    size: int | tuple[int, int] | None = None,
    vmin: float | None = None,
    vmax: float | None = None,
) -> np.ndarray:
    """The one renderer of a map's picture: uint8 RGB ``[..., h, w, 3]`` of ``maps`` (one map
    ``[gh, gw]`` or a stack ``[..., gh, gw]``), each over the picture (fast: numpy + PIL).

    Each map is scaled to its own min..max (unless ``vmin`` / ``vmax``), coloured with the
    matplotlib colormap ``cmap``, upsampled bilinearly (``smooth``) or as flat squares, and
    alpha-blended: ``(1 - alpha) * picture + alpha * colour``. ``size``: output (width,
    height), or an int for the longer side; default the picture's size (16 px per patch when
    ``picture`` is None, which shows the maps alone). The app's pictures (:func:`overlay_image`,
    :func:`heads_image`) and the exported figures (:mod:`~vit_demo.viz.figures`) all draw a map
    with it, so the same map is the same pixels on the page and in a slide.
    """
    m = as_maps(maps, (2, 3, 4), "maps")
    pic, (w, h) = _sized_picture(picture, m.shape[-2:], size)
    return blend(pic, colorize(upsample(normalize(m, vmin, vmax), (h, w), smooth), cmap), alpha)


def _sized_picture(picture: Picture | None, grid: tuple[int, int], size: int | tuple[int, int] | None
                   ) -> tuple[np.ndarray | None, tuple[int, int]]:
    """The picture at ``size`` (see :func:`~vit_demo.viz.arrays.target_size`) as uint8 RGB, and
    that (width, height); without a picture, None and the size of a ``grid`` (gh, gw) map at 16
    px per patch, scaled the same way."""
    if picture is None:
        return None, target_size(grid[1] * 16, grid[0] * 16, size)
    pic0 = picture if isinstance(picture, Image.Image) else picture_array(picture)
    w0, h0 = pic0.size if isinstance(pic0, Image.Image) else (pic0.shape[1], pic0.shape[0])
    w, h = target_size(w0, h0, size)
    return resized_picture(pic0, (w, h)), (w, h)


def overlay_image(
    picture: Picture | None,
    heat: Any,
    cmap: str = "inferno",
    alpha: float = 0.6,
    smooth: bool = True,
    size: int | tuple[int, int] | None = None,
    vmin: float | None = None,
    vmax: float | None = None,
    mark: int | None = None,
) -> Image.Image:
    """A ``[gh, gw]`` map over the picture, as one RGB PIL image (:func:`overlay_array`: the
    arguments are its own). ``mark``: a patch index to outline (e.g. the query patch)."""
    m = as_maps(heat, (2,), "heat")
    img = Image.fromarray(overlay_array(picture, m, cmap, alpha, smooth, size, vmin, vmax))
    if mark is not None:
        w, h = img.size
        _outline(ImageDraw.Draw(img), patch_box(mark, m.shape, (w, h)), max(2, round(min(w, h) / 150)))
    return img


def live_picture(
    picture: Picture,
    heat: Any,
    cmap: str = "inferno",
    alpha: float = 0.6,
    texts: tuple[str, str, str] = ("", "", ""),
    side: int = 448,
    band: int = 44,
) -> Image.Image:
    """A live camera frame's picture, cheap enough for every frame (a few milliseconds): the map
    over the picture at the picture's own size (:func:`overlay_array`), enlarged to ``side`` px, with
    a dark band of ``band`` px under it holding ``texts``: a name (shortened with "…" to fit), a
    number after it, and a note at the right (the class, its probability, the rate)."""
    small = Image.fromarray(overlay_array(picture, as_maps(heat, (2,), "heat"), cmap, alpha))
    w, h = target_size(small.width, small.height, side)
    img = Image.new("RGB", (w, h + band), (20, 20, 24))
    img.paste(small.resize((w, h), Image.Resampling.BILINEAR), (0, 0))
    draw, font, pad = ImageDraw.Draw(img), text_font(max(10, band * 11 // 20)), band // 4
    name, number, right = texts
    room = w - 4 * pad - text_width(right, font) - text_width(number, font)
    while name and text_width(name, font) > room:
        name = name[:-2].rstrip() + "…"
    y = h + band // 2
    draw.text((pad, y), name, fill=(255, 255, 255), font=font, anchor="lm")
    draw.text((2 * pad + text_width(name, font), y), number, fill=(255, 214, 102), font=font, anchor="lm")
    draw.text((w - pad, y), right, fill=(200, 200, 200), font=font, anchor="rm")
    return img


def heads_image(
    picture: Picture | None,
    maps: Any,
    cmap: str = "inferno",
    alpha: float = 0.6,
    smooth: bool = True,
    titles: bool = True,
    tile: int | None = None,
    layer: int | None = None,
    mark: int | None = None,
) -> Image.Image:
    """Every head's map as a tiled mosaic (fast: numpy + PIL).

    ``maps``: ``[H, gh, gw]`` (one layer: tiles wrap into rows of at most 6, each labelled
    "head 3", or "L12 H3" when ``layer`` is given) or ``[L, H, gh, gw]`` (the whole model:
    layers labelled "L1".. and heads "H1"..; the longer of the two runs across, so that 12
    layers x 3 heads fill a wide page rather than a narrow column). People count layers and
    heads from 1 (``layer`` is still the index, from 0). Each tile is
    :func:`overlay_array` of its map, scaled to its own min..max. ``tile``: longer side of a
    tile in pixels (default 160 for one layer, 96 for the whole model). ``mark``: a patch to outline.
    """
    a = as_maps(maps, (3, 4), "maps")
    whole = a.ndim == 4
    L, H = (a.shape[0], a.shape[1]) if whole else (1, a.shape[0])
    gh, gw = a.shape[-2:]
    tile = int(tile or (96 if whole else 160))
    tiles = overlay_array(picture, a, cmap, alpha, smooth, tile)
    th, tw = tiles.shape[-3:-1]
    across = whole and L > H  # layers across the page (columns), heads down (rows)
    tiles = tiles.reshape(L, H, th, tw, 3).transpose(1, 0, 2, 3, 4).reshape(L * H, th, tw, 3) if across else \
        tiles.reshape(L * H, th, tw, 3)

    gap = max(2, tile // 40)
    fsize = max(10, min(15, tile // 8))
    font = text_font(fsize, bold=True)
    label_h = fsize + 6 if titles else 0
    if whole:  # labels once: above the columns and left of the rows
        rows, cols = (H, L) if across else (L, H)
        left = (text_width("L00", font) + 10) if titles else 0
        step_y = th + gap
    else:  # a label above every tile
        cols = H if H <= 6 else math.ceil(H / math.ceil(H / 6))
        rows = math.ceil(H / cols)
        left, step_y = 0, th + gap + label_h
    canvas, origins = _tile_canvas(tiles, rows, cols, (left, label_h), (tw + gap, step_y))
    img = Image.fromarray(canvas)
    draw = ImageDraw.Draw(img)
    if mark is not None:
        for x, y in origins:
            x0, y0, x1, y1 = patch_box(mark, (gh, gw), (tw, th))
            _outline(draw, (x + x0, y + y0, x + x1, y + y1), 2)
    if titles and whole:
        _title_rows_and_columns(draw, origins[:cols], origins[::cols], (tw, th), font, "LH" if across else "HL")
    elif titles:
        for i, (x, y) in enumerate(origins):
            name = f"head {i + 1}" if layer is None else f"L{layer + 1} H{i + 1}"
            draw.text((x + tw / 2, y - label_h / 2), name, font=font, fill=_TILE_INK, anchor="mm")
    return img


_TILE_INK = (40, 40, 40)  # the tiles' labels


def _tile_canvas(tiles: np.ndarray, rows: int, cols: int, first: tuple[int, int], step: tuple[int, int]
                 ) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """Tiles ``[n, th, tw, 3]`` on a white canvas, row-major in ``cols`` columns: tile 0's
    top-left corner at ``first`` (x, y), ``step`` (dx, dy) pixels from one tile to the next
    across and down. The canvas ends at the last row's and column's far edge. Returns the
    canvas and each tile's top-left corner."""
    n, th, tw = tiles.shape[:3]
    height, width = first[1] + (rows - 1) * step[1] + th, first[0] + (cols - 1) * step[0] + tw
    canvas = np.full((height, width, 3), 255, dtype=np.uint8)
    origins = []
    for i in range(n):
        r, c = divmod(i, cols)
        x, y = first[0] + c * step[0], first[1] + r * step[1]
        canvas[y : y + th, x : x + tw] = tiles[i]
        origins.append((x, y))
    return canvas, origins


def _title_rows_and_columns(draw: ImageDraw.ImageDraw, top_row: list[tuple[int, int]], left_column: list[tuple[int, int]],
                            size: tuple[int, int], font, letters: str = "HL") -> None:
    """Labels counted from 1 centred above the tiles of ``top_row`` (``letters[0]``: "H" for
    heads, "L" for layers) and right-aligned left of the tiles of ``left_column`` (tiles'
    top-left corners, of ``size``)."""
    tw, th = size
    for i, (x, y) in enumerate(top_row):
        draw.text((x + tw / 2, y / 2), f"{letters[0]}{i + 1}", font=font, fill=_TILE_INK, anchor="mm")
    for r, (x, y) in enumerate(left_column):
        draw.text((x - 6, y + th / 2), f"{letters[1]}{r + 1}", font=font, fill=_TILE_INK, anchor="rm")


def patch_grid_image(
    picture: Picture,
    patch_size: int,
    numbers: bool = True,
    highlight: int | None = None,
    scale: int | None = None,
    window: int = 0,
) -> Image.Image:
    """The picture cut into its patches: grid lines, each patch numbered 0..gh*gw-1 in
    row-major order (the order the transformer reads them), ``highlight`` (e.g. the selected
    query patch) outlined, ``window``: the attention windows of that many patches a side drawn
    (:func:`draw_windows`). Fast: PIL only (the grid and number masks are cached per size).

    ``scale``: integer upscaling so the numbers are readable (default: patch cells of at
    least 32 px, e.g. 2x for 16-px patches: 224 -> 448 px). Use :func:`patch_index_at` with
    the returned image's size to map a click back to a patch.
    """
    img = picture if isinstance(picture, Image.Image) else Image.fromarray(picture_array(picture))
    img = img.convert("RGB")
    p = int(patch_size)
    gw, gh = img.width // p, img.height // p
    if gw < 1 or gh < 1:
        raise ValueError(f"a {img.width}x{img.height} picture holds no {p}-px patch")
    if scale is None:
        scale = max(1, math.ceil(32 / p)) if numbers else 1
    cell = p * int(scale)
    img = img.crop((0, 0, gw * p, gh * p)).resize((gw * cell, gh * cell), Image.Resampling.BICUBIC)
    box = None
    if highlight is not None:
        box = tuple(round(v) for v in patch_box(highlight, (gh, gw), img.size))
        region = img.crop(box)
        img.paste(Image.blend(region, Image.new("RGB", region.size, HIGHLIGHT_RGB), 0.35), box[:2])
    lines, outline, glyphs = _grid_masks(gh, gw, cell, bool(numbers))
    img.paste((255, 255, 255), (0, 0, *img.size), lines)
    if numbers:
        img.paste((0, 0, 0), (0, 0, *img.size), outline)
        img.paste((255, 255, 255), (0, 0, *img.size), glyphs)
    if window:
        draw_windows(img, (gh, gw), window)
    if box is not None:
        _outline(ImageDraw.Draw(img), box, max(2, cell // 12))
    return img


def draw_windows(img: Image.Image, grid: tuple[int, int], window: int) -> Image.Image:
    """``img`` (a ``grid`` of (gh, gw) patches edge to edge) with the borders of the attention
    windows drawn in place: squares of ``window`` patches a side from the top-left corner, as SAM
    cuts the grid (the last row and column of windows cut off by the grid's edge). Returned."""
    gh, gw = grid
    sx, sy = img.width / gw, img.height / gh
    draw = ImageDraw.Draw(img)
    width = max(2, round(min(sx, sy) / 5))
    for c in range(window, gw, window):
        x = round(c * sx)
        draw.line([(x, 0), (x, img.height)], fill=WINDOW_RGB, width=width)
    for r in range(window, gh, window):
        y = round(r * sy)
        draw.line([(0, y), (img.width, y)], fill=WINDOW_RGB, width=width)
    draw.rectangle([0, 0, img.width - 1, img.height - 1], outline=WINDOW_RGB, width=max(1, width // 2))
    return img


@lru_cache(maxsize=8)
def _grid_masks(gh: int, gw: int, cell: int, numbers: bool) -> tuple[Image.Image, Image.Image, Image.Image]:
    """Picture-independent "L" masks: grid lines, the numbers' dark outline, the numbers."""
    size = (gw * cell, gh * cell)
    lines = Image.new("L", size, 0)
    draw = ImageDraw.Draw(lines)
    width = max(1, cell // 24)
    for c in range(1, gw):
        draw.line([(c * cell, 0), (c * cell, size[1])], fill=150, width=width)
    for r in range(1, gh):
        draw.line([(0, r * cell), (size[0], r * cell)], fill=150, width=width)
    outline, glyphs = Image.new("L", size, 0), Image.new("L", size, 0)
    if numbers:
        digits = len(str(gh * gw - 1))
        fsize = max(7, min(int(cell * 0.36), int(cell * 0.8 / (0.62 * digits + 0.1))))
        font = text_font(fsize, bold=True)
        d_out, d_txt = ImageDraw.Draw(outline), ImageDraw.Draw(glyphs)
        stroke = max(1, round(fsize / 7))
        for i in range(gh * gw):
            xy = ((i % gw + 0.5) * cell, (i // gw + 0.5) * cell)
            d_out.text(xy, str(i), font=font, fill=255, anchor="mm", stroke_width=stroke, stroke_fill=255)
            d_txt.text(xy, str(i), font=font, fill=255, anchor="mm")
    return lines, outline, glyphs


def tiles_image(
    picture: Picture,
    maps: Mapping[str, Any],
    cmap: str = "inferno",
    alpha: float = 0.6,
    smooth: bool = True,
    tile: int = 260,
    pending: Sequence[str] = (),
    columns: int | None = None,
) -> Image.Image:
    """Labelled overlays side by side (fast: PIL). A title's first line is bold, a second line
    (after "\\n") smaller. ``pending``: titles of maps still being computed, drawn as grey
    placeholders so the layout does not jump when they arrive. ``columns``: at most this many
    tiles a row (a phone's screen), the rest in rows below; default one row."""
    titles = list(maps) + list(pending)
    bold, small = text_font(16, bold=True), text_font(14)
    gap, label_h = 12, 46
    n = len(titles)
    cols = max(1, min(n, columns or n))
    rows = -(-n // cols)
    canvas = Image.new("RGB", (cols * tile + (cols - 1) * gap, rows * (tile + label_h) + (rows - 1) * gap), "white")
    draw = ImageDraw.Draw(canvas)

    def fit(text: str, font) -> str:
        while text_width(text, font) > tile and len(text) > 4:
            text = text[:-2].rstrip() + "…"
        return text

    for i, title in enumerate(titles):
        x, y = (i % cols) * (tile + gap), (i // cols) * (tile + label_h + gap)
        if title in maps:
            canvas.paste(overlay_image(picture, maps[title], cmap, alpha, smooth, size=(tile, tile)), (x, y + label_h))
        else:
            draw.rectangle((x, y + label_h, x + tile - 1, y + label_h + tile - 1), fill=(236, 236, 236))
            draw.text((x + tile / 2, y + label_h + tile / 2), "computing…", font=bold, fill=(120, 120, 120), anchor="mm")
        first, _, second = title.partition("\n")
        draw.text((x + tile / 2, y + 12), fit(first, bold), font=bold, fill=(34, 34, 34), anchor="mm")
        if second:
            draw.text((x + tile / 2, y + 33), fit(second, small), font=small, fill=(102, 102, 102), anchor="mm")
    return canvas


def with_colorbar(img: Image.Image, cmap: str = "inferno", note: str = "each map scaled to its own range",
                  low: str = "low", high: str = "high") -> Image.Image:
    """``img`` with a colour bar under it (fast: PIL): the colormap from ``low`` to ``high``
    (words: the values are relative) and ``note`` beneath, saying what the scale is."""
    font = text_font(14)
    bar_w = int(min(420, max(160, 0.6 * img.width)))
    pad_l, pad_r = text_width(low, font) + 10, text_width(high, font) + 10
    bar_w = min(bar_w, img.width - pad_l - pad_r - 4)
    strip = Image.new("RGB", (img.width, 46), "white")
    x0 = (img.width - bar_w) // 2
    strip.paste(Image.fromarray(colorize(np.tile(np.linspace(0, 1, bar_w, dtype=np.float32), (12, 1)), cmap)), (x0, 6))
    draw = ImageDraw.Draw(strip)
    draw.text((x0 - 6, 12), low, font=font, fill=_MUTED, anchor="rm")
    draw.text((x0 + bar_w + 6, 12), high, font=font, fill=_MUTED, anchor="lm")
    draw.text((img.width / 2, 34), note, font=font, fill=_MUTED, anchor="mm")
    out = Image.new("RGB", (img.width, img.height + strip.height), "white")
    out.paste(img.convert("RGB"), (0, 0))
    out.paste(strip, (0, img.height))
    return out


def stem_image(picture: Picture, stages: Sequence[tuple[str, str, Any]], tile: int = 150) -> Image.Image:
    """A convolutional stem at work (fast: PIL): the picture, then each stage's map at its own
    resolution (flat squares in inferno, each scaled to its own range), arrows between them. ``stages``:
    (title, second line, map ``[h, w]``) each, e.g. ("stage 1 · 16×16", "mean of 32 channels", map)."""
    pic = picture_array(picture)
    h0, w0 = pic.shape[:2]
    size = target_size(w0, h0, tile)
    panels = [(f"input · {w0}×{h0}", "3 channels (RGB)", Image.fromarray(pic).resize(size, Image.Resampling.NEAREST))]
    panels += [(t, sub, overlay_image(None, m, smooth=False, size=size)) for t, sub, m in stages]
    arrow = text_font(22, bold=True)
    gap, label_h = 34, 44

    def font(text: str, px: int, bold: bool = False):  # the largest size down to 10 px that fits the panel
        while px > 10 and text_width(text, text_font(px, bold)) > size[0] + gap - 8:
            px -= 1
        return text_font(px, bold)

    width = len(panels) * size[0] + (len(panels) - 1) * gap
    canvas = Image.new("RGB", (width, size[1] + label_h), "white")
    draw = ImageDraw.Draw(canvas)
    for i, (title, sub, img) in enumerate(panels):
        x = i * (size[0] + gap)
        canvas.paste(img, (x, label_h))
        draw.rectangle((x, label_h, x + size[0] - 1, label_h + size[1] - 1), outline=(136, 136, 136))
        draw.text((x + size[0] / 2, 11), title, font=font(title, 15, bold=True), fill=_INK, anchor="mm")
        draw.text((x + size[0] / 2, 31), sub, font=font(sub, 13), fill=_MUTED, anchor="mm")
        if i:
            draw.text((x - gap / 2, label_h + size[1] / 2), "→", font=arrow, fill=_MUTED, anchor="mm")
    return canvas


_SEQ_TAIL = 3  # the last patches a sequence picture always shows
_SEQ_BOX, _SEQ_GAP, _SEQ_Y = 56, 10, 86  # px: a token's box, the gap between boxes, the boxes' top
_INK, _MUTED, _POSITION_RGB = (34, 34, 34), (102, 102, 102), (155, 143, 184)


def sequence_image(
    picture: Picture,
    patch_size: int,
    prefix_names: Sequence[str] = ("[class]",),
    highlight: int | None = None,
    width: int = 1120,
    embed_dim: int | None = None,
    tokenizer: str | None = None,
) -> Image.Image:
    """The flattened sequence the transformer reads (fast: PIL), ``width`` x 250 px: the
    prefix tokens (``prefix_names``, e.g. ``TokenLayout.names()``), then the patches left to
    right, top to bottom (the first ones, an ellipsis, the last ones, and the ``highlight``
    patch wherever it sits), each with its patch number above and its position in the
    sequence below. As many patches are shown as fit the width (slots from
    :func:`~vit_demo.viz.sequence.sequence_slots`). ``embed_dim``: the token vectors' size,
    for the caption; ``tokenizer``: how a token is made, in place of the caption's "Each p×p×3-pixel
    patch is flattened and projected to ..." (a convolutional stem's tokens are not).
    """
    pic = picture_array(picture)
    p = int(patch_size)
    gh, gw = pic.shape[0] // p, pic.shape[1] // p
    if gh < 1 or gw < 1:
        raise ValueError(f"a {pic.shape[1]}x{pic.shape[0]} picture holds no {p}-px patch")
    names = list(prefix_names)
    head = _sequence_head(width, len(names), highlight is not None)
    slots = sequence_slots(names, gh * gw, head, _SEQ_TAIL, highlight)
    img = Image.new("RGB", (width, 250), "white")
    draw = ImageDraw.Draw(img)
    x0 = max(80, (width - (len(slots) * (_SEQ_BOX + _SEQ_GAP) - _SEQ_GAP)) // 2)
    _sequence_heading(draw, width, x0, names, gh * gw)
    for k, slot in enumerate(slots):
        x = x0 + k * (_SEQ_BOX + _SEQ_GAP)
        if slot.kind == "patch":
            r, c = divmod(slot.patch, gw)
            _sequence_patch(img, draw, x, pic[r * p:(r + 1) * p, c * p:(c + 1) * p], slot.patch, slot.patch == highlight)
        elif slot.kind == "prefix":
            _sequence_prefix(draw, x, slot.name)
        else:
            draw.text((x + _SEQ_BOX / 2, _SEQ_Y + _SEQ_BOX / 2), "…", font=text_font(17, bold=True), fill=_MUTED, anchor="mm")
            continue
        _sequence_position(draw, x, slot.position)
    _sequence_caption(draw, width, p, names, embed_dim, tokenizer)
    return img


def _sequence_head(width: int, num_prefix: int, highlight: bool) -> int:
    """How many first patches :func:`sequence_image` shows at ``width`` px: what fits after
    the ``num_prefix`` prefix tokens, the last patches, an ellipsis and (``highlight``) room
    for a highlighted patch and a second ellipsis; at least 2."""
    slots_fit = max(6, (width - 110) // (_SEQ_BOX + _SEQ_GAP))
    return max(2, slots_fit - num_prefix - _SEQ_TAIL - 1 - (2 if highlight else 0))


def _sequence_heading(draw: ImageDraw.ImageDraw, width: int, x0: int, names: list[str], n: int) -> None:
    """The title line, and the "patch" / "position" row labels left of the first slot."""
    head = f"{' + '.join(names)} + {n} patches = {len(names) + n} tokens" if names else f"{n} patches = {n} tokens"
    draw.text((width / 2, 20), f"The sequence the transformer reads: {head}", font=text_font(17, bold=True), fill=_INK,
              anchor="mm")
    small = text_font(13)
    draw.text((x0 - 8, _SEQ_Y - 14), "patch", font=small, fill=_MUTED, anchor="rm")
    draw.text((x0 - 8, _SEQ_Y + _SEQ_BOX + 16), "position", font=small, fill=_MUTED, anchor="rm")


def _sequence_prefix(draw: ImageDraw.ImageDraw, x: int, name: str) -> None:
    """A prefix token: a rounded box in the token's colour, its name inside."""
    draw.rounded_rectangle((x, _SEQ_Y, x + _SEQ_BOX, _SEQ_Y + _SEQ_BOX), radius=8, fill=token_color(name))
    draw.text((x + _SEQ_BOX / 2, _SEQ_Y + _SEQ_BOX / 2), name, font=text_font(12, bold=True), fill="white", anchor="mm")


def _sequence_patch(img: Image.Image, draw: ImageDraw.ImageDraw, x: int, cut: np.ndarray, index: int, lit: bool) -> None:
    """A patch: its pixels enlarged (nearest), framed (cyan when ``lit``), its number above."""
    img.paste(Image.fromarray(cut).resize((_SEQ_BOX, _SEQ_BOX), Image.Resampling.NEAREST), (x, _SEQ_Y))
    draw.rectangle((x - 1, _SEQ_Y - 1, x + _SEQ_BOX, _SEQ_Y + _SEQ_BOX), outline=HIGHLIGHT_RGB if lit else (136, 136, 136),
                   width=3 if lit else 1)
    draw.text((x + _SEQ_BOX / 2, _SEQ_Y - 14), str(index), font=text_font(13), fill=_INK, anchor="mm")


def _sequence_position(draw: ImageDraw.ImageDraw, x: int, position: int) -> None:
    """A token's position in the sequence, in a small lilac pill under its box."""
    y = _SEQ_Y + _SEQ_BOX
    draw.rounded_rectangle((x + 8, y + 6, x + _SEQ_BOX - 8, y + 26), radius=6, fill=_POSITION_RGB)
    draw.text((x + _SEQ_BOX / 2, y + 16), str(position), font=text_font(12, bold=True), fill="white", anchor="mm")


def _sequence_caption(draw: ImageDraw.ImageDraw, width: int, p: int, names: list[str], embed_dim: int | None,
                      tokenizer: str | None = None) -> None:
    """Two lines under the sequence: how a patch becomes a token, and the position embedding."""
    dim = f"a {embed_dim}-number vector" if embed_dim else "one vector"
    lines = [
        (tokenizer or f"Each {p}×{p}×3-pixel patch is flattened and projected to {dim}") + "; "
        + (f"{' and '.join(names)} {'are learned vectors' if len(names) > 1 else 'is a learned vector'} "
           "of the same size." if names else "there are no extra tokens."),
        "A learned position embedding is added to every token: the model is told where each patch came from.",
    ]
    for i, line in enumerate(lines):
        draw.text((width / 2, 192 + i * 22), line, font=text_font(13), fill=_MUTED, anchor="mm")
