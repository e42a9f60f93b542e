"""Example photos for the app, found where installed packages keep them (nothing is copied
into the repository and nothing is downloaded).

- matplotlib's sample data: ``grace_hopper.jpg`` (public domain, US Navy);
- scikit-image's bundled ``skimage/data`` files: ``chelsea.png`` (a cat), ``coffee.png``,
  ``astronaut.png`` (Eileen Collins, NASA, public domain), ``rocket.jpg`` (NASA, public
  domain) and ``motorcycle_left.png``;
- a folder of the user's own: ``--examples DIR`` or ``$VIT_DEMO_EXAMPLES`` (``os.pathsep``
  separated folders or files).

Missing packages or files are skipped silently: the app works without examples.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

from ..images import IMAGE_SUFFIXES

ENV_EXAMPLES = "VIT_DEMO_EXAMPLES"
MAX_USER_EXAMPLES = 48  # a gallery, not a data set

# (package, path inside the package, short caption), in the order the app shows them
BUILTIN = (
    ("skimage", "data/chelsea.png", "Cat"),
    ("matplotlib", "mpl-data/sample_data/grace_hopper.jpg", "Grace Hopper"),
    ("skimage", "data/coffee.png", "Coffee"),
    ("skimage", "data/astronaut.png", "Astronaut"),
    ("skimage", "data/rocket.jpg", "Rocket"),
    ("skimage", "data/motorcycle_left.png", "Motorcycle"),
)


@dataclass(frozen=True)
class Example:
    path: Path
    caption: str
    source: str  # "builtin" or "user"


def package_dir(name: str) -> Path | None:
    """Where an installed package lives, without importing it (None when absent)."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations)))
    return Path(spec.origin).parent if spec.origin else None


def builtin_examples() -> list[Example]:
    """The bundled photos that exist on this machine, in display order."""
    out = []
    for pkg, rel, caption in BUILTIN:
        root = package_dir(pkg)
        if root is not None and (root / rel).is_file():
            out.append(Example(root / rel, caption, "builtin"))
    return out


def _caption(p: Path) -> str:
    return p.stem.replace("_", " ").replace("-", " ")


def user_examples(roots: list[str | os.PathLike] | None = None) -> list[Example]:
    """Images from the given folders/files and ``$VIT_DEMO_EXAMPLES`` (sorted per folder,
    at most :data:`MAX_USER_EXAMPLES`)."""
    env = [p for p in os.environ.get(ENV_EXAMPLES, "").split(os.pathsep) if p]
    out: list[Example] = []
    seen: set[Path] = set()
    for root in map(Path, [*(roots or []), *env]):
        if root.is_dir():
            files = sorted(f for f in root.iterdir() if f.is_file() and f.suffix.lower() in IMAGE_SUFFIXES)
        elif root.is_file() and root.suffix.lower() in IMAGE_SUFFIXES:
            files = [root]
        else:
            continue
        for f in files:
            r = f.resolve()
            if r not in seen:
                seen.add(r)
                out.append(Example(f, _caption(f), "user"))
    return out[:MAX_USER_EXAMPLES]


def all_examples(roots: list[str | os.PathLike] | None = None) -> list[Example]:
    """The user's examples first (they chose them), then the bundled ones."""
    return user_examples(roots) + builtin_examples()
