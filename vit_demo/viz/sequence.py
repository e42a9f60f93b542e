"""The token sequence a ViT reads, as the pictures show it: which tokens get a slot (the prefix
tokens, the first patches, an ellipsis, a highlighted patch, the last patches), with each
slot's patch number and position in the sequence. Pure layout, no drawing: the fast PIL
renderer (:func:`~vit_demo.viz.previews.sequence_image`) and the slide figure
(:func:`~vit_demo.viz.figures.patch_grid_figure`) both draw from :func:`sequence_slots`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple


class SequenceSlot(NamedTuple):
    """One slot of a drawn token sequence, left to right.

    ``kind``: "prefix" (a prefix token such as "[class]"; ``name`` is its name), "patch"
    (``patch`` is its row-major patch number) or "gap" (an ellipsis standing for skipped
    patches; ``name``, ``patch`` and ``position`` are None). ``position``: the token's index
    in the sequence the transformer reads (prefix tokens first, then the patches).
    """

    kind: str
    name: str | None = None
    patch: int | None = None
    position: int | None = None


def sequence_slots(
    prefix_names: Sequence[str],
    num_patches: int,
    head: int,
    tail: int,
    highlight: int | None = None,
) -> list[SequenceSlot]:
    """The slots a picture of the token sequence shows: every prefix token, then the first
    ``head`` patches, the patch ``highlight`` (if given and in range), and the last ``tail``
    patches, in sequence order, with a "gap" slot wherever patches are skipped.

    A sequence of at most ``head + tail`` patches is shown whole. Each patch is shown once
    (a highlight among the first or last patches adds no slot).

    >>> [s.patch for s in sequence_slots([], 10, head=2, tail=2, highlight=5)]
    [0, 1, None, 5, None, 8, 9]
    """
    n = int(num_patches)
    shown = set(range(min(max(0, int(head)), n))) | set(range(max(0, n - int(tail)), n))
    if highlight is not None and 0 <= highlight < n:
        shown.add(int(highlight))
    P = len(prefix_names)
    slots = [SequenceSlot("prefix", name=name, position=k) for k, name in enumerate(prefix_names)]
    after = -1  # the last patch shown so far
    for i in sorted(shown):
        if i > after + 1:
            slots.append(SequenceSlot("gap"))
        slots.append(SequenceSlot("patch", patch=i, position=P + i))
        after = i
    if after < n - 1:  # nothing shown at the end (tail 0): the skipped rest
        slots.append(SequenceSlot("gap"))
    return slots
