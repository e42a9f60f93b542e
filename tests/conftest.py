"""Shared fixtures. The real checkpoint ships in weights/; real photos come from matplotlib's
and scikit-image's bundled sample data (installed with the project). Only the ImageNet sample
in ../shared is optional: the tests that need it skip with a clear reason when it is absent."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from vit_demo.model import VisionTransformer, ViTConfig

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tests never touch the network
# --precision auto means fp32 in the tests on every machine, so that every parity test runs in float32 as before;
# tests/test_precision.py asks for bf16 by name (VIT_DEMO_NO_BF16=0 runs the suite with the detection on)
os.environ.setdefault("VIT_DEMO_NO_BF16", "1")
torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))

ROOT = Path(__file__).resolve().parent.parent
SHARED = Path(os.environ.get("VIT_DEMO_SHARED", ROOT.parent / "shared"))
DEIT_TINY = ROOT / "weights" / "deit_tiny_patch16_224.safetensors"  # embedded in the repo (weights/README.md)
SAMPLE = SHARED / "imagenet-sample"


def _need(path: Path) -> Path:
    if not path.exists():
        pytest.skip(f"needs {path} (the project's shared data; absent on this machine)")
    return path


@pytest.fixture(scope="session")
def deit_tiny_path() -> Path:
    """The real ImageNet-trained DeiT-Tiny checkpoint (timm layout) that ships in weights/."""
    return DEIT_TINY


@pytest.fixture(scope="session")
def sample_images() -> list[Path]:
    """All 1000 shared ImageNet photos, sorted (class index = position)."""
    return sorted(_need(SAMPLE).glob("*.JPEG"))


@pytest.fixture(scope="session")
def quick_images(sample_images: list[Path]) -> list[Path]:
    """The 100-image quick subset: every 10th file (class indices 0, 10, ..., 990)."""
    return sample_images[::10]


@pytest.fixture(scope="session")
def deit_tiny(deit_tiny_path: Path):
    """LoadedModel: the scratch DeiT-Tiny with the real weights, on the CPU, eval mode."""
    from vit_demo.checkpoints.load import load_model

    return load_model("deit_tiny_patch16_224", deit_tiny_path, device="cpu")


@pytest.fixture(scope="session")
def deit_tiny_timm(deit_tiny_path: Path):
    """timm's own DeiT-Tiny loaded with the same file, eval mode."""
    import safetensors.torch
    import timm

    tm = timm.create_model("deit_tiny_patch16_224", pretrained=False).eval()
    tm.load_state_dict(safetensors.torch.load_file(str(deit_tiny_path)))
    return tm


# Photos that ship inside installed packages (public domain / permissively licensed), with the
# top-1 classes the embedded DeiT-Tiny gives them (checked: see tests/test_defaults.py).
PACKAGE_PHOTOS: dict[str, tuple[str, str]] = {
    "chelsea": ("skimage", "data/chelsea.png"),  # a tabby cat
    "coffee": ("skimage", "data/coffee.png"),  # a cup of espresso
    "grace_hopper": ("matplotlib", "mpl-data/sample_data/grace_hopper.jpg"),  # in uniform
    "motorcycle": ("skimage", "data/motorcycle_left.png"),
    "camera": ("skimage", "data/camera.png"),  # greyscale: a photographer with a tripod camera
    "astronaut": ("skimage", "data/astronaut.png"),
    "rocket": ("skimage", "data/rocket.jpg"),
    "horse": ("skimage", "data/horse.png"),  # a black silhouette with an alpha channel (RGBA)
    "page": ("skimage", "data/page.png"),  # greyscale scan of text
}
PHOTO_TOP1: dict[str, frozenset[str]] = {  # acceptable top-1 labels (ImageNet names)
    "chelsea": frozenset({"Egyptian cat", "tabby", "tiger cat"}),
    "coffee": frozenset({"espresso"}),
    "grace_hopper": frozenset({"military uniform"}),
    "motorcycle": frozenset({"moped", "motor scooter"}),
    "camera": frozenset({"tripod"}),
}


@pytest.fixture(scope="session")
def package_photos() -> dict[str, Path]:
    """Real photos bundled with matplotlib and scikit-image, by short name (see PACKAGE_PHOTOS)."""
    from vit_demo.app.examples import package_dir

    out = {}
    for name, (pkg, rel) in PACKAGE_PHOTOS.items():
        root = package_dir(pkg)
        if root is None or not (root / rel).is_file():
            pytest.skip(f"needs {pkg}'s sample photo {rel} (pip install -c requirements.txt -e .)")
        out[name] = root / rel
    return out


@pytest.fixture(scope="session")
def labelled_photos(package_photos: dict[str, Path]) -> list[tuple[Path, frozenset[str]]]:
    """The package photos whose top-1 class is known, with the acceptable labels."""
    return [(package_photos[n], PHOTO_TOP1[n]) for n in PHOTO_TOP1]


# ----------------------------------------------------------------------------- the fast tier

# ``pytest -m "not slow"`` answers in minutes; CI runs it first, then the rest (``-m slow``). A test is
# slow when it is marked ``slow`` (or ``browser``), when it or a fixture it uses starts the app in a
# subprocess or drives a browser (calls one of SLOW_CALLS), or when it uses one of SLOW_FIXTURES
# (models trained for the test): such a test is marked ``slow`` here, however and whenever it is written.
SLOW_CALLS = ("running_app(", "start_app(", "sync_playwright(")
SLOW_FIXTURES = frozenset({"lesson_models"})


def _starts_something_slow(fn, seen: dict) -> bool:
    """Whether ``fn``'s source calls one of :data:`SLOW_CALLS` (cached per function)."""
    import inspect

    if fn not in seen:
        try:
            src = inspect.getsource(fn)
        except (OSError, TypeError):
            src = ""
        seen[fn] = any(call in src for call in SLOW_CALLS)
    return seen[fn]


def is_slow(item, seen: dict | None = None) -> bool:
    """Whether a collected test belongs to the slow tier (see :data:`SLOW_CALLS`, :data:`SLOW_FIXTURES`)."""
    seen = {} if seen is None else seen
    if item.get_closest_marker("slow") or item.get_closest_marker("browser"):
        return True
    if SLOW_FIXTURES.intersection(getattr(item, "fixturenames", ())):
        return True
    fns = [getattr(item, "function", None)]
    info = getattr(item, "_fixtureinfo", None)
    for defs in (info.name2fixturedefs.values() if info else ()):
        fns += [d.func for d in defs]
    return any(fn is not None and _starts_something_slow(fn, seen) for fn in fns)


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects by marker
def pytest_collection_modifyitems(config, items) -> None:
    seen: dict = {}
    for item in items:
        if not item.get_closest_marker("slow") and is_slow(item, seen):
            item.add_marker(pytest.mark.slow)


# ----------------------------------------------------------------------------- the browser tests' fixtures

CHROMIUM = Path("/usr/bin/chromium")  # Debian's chromium (apt-get install chromium); never a downloaded one
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", "--disable-quic"]


@pytest.fixture(scope="module")
def browser():
    if not CHROMIUM.exists():
        pytest.skip(f"needs Chromium at {CHROMIUM} (apt-get install chromium; .ci/browser-deps does it in CI)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="needs the playwright package")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture(scope="module")
def app(deit_tiny_path: Path):
    if not CHROMIUM.exists():
        pytest.skip(f"needs Chromium at {CHROMIUM}")
    from app_server import running_app

    with running_app(["--weights", str(deit_tiny_path)]) as a:
        yield a


# ----------------------------------------------------------------------------- the app attacked over HTTP

# One server per mode for the whole run, shared by tests/test_app_guard.py and tests/test_app_mcp.py
# (each started its own: two starts saved). Both serve the MCP tools. A test that spends an
# address's share (its upload budget, its places in the queue) calls from a loopback address of
# its own (127.0.0.x), so that the others still find theirs.
EXPOSED_FLAGS = ("--exposed", "--max-queue", "8", "--upload-budget-mb", "2", "--max-upload-mb", "1")


@pytest.fixture(scope="session")
def local_app(deit_tiny_path: Path):
    """The app as a person runs it on this computer (``--mcp``), answering to demo.lan too."""
    from app_server import running_app

    with running_app(["--weights", str(deit_tiny_path), "--mcp", "--no-warm-up", "--allowed-host", "demo.lan"]) as a:
        yield a


@pytest.fixture(scope="session")
def exposed_app(deit_tiny_path: Path):
    """The app with the limits of an open demo (``--exposed --mcp``) and small budgets: 8 places in
    the queue (4 per address), 2 MB of uploads per address and 10 minutes, pictures of 1 MB."""
    from app_server import running_app

    with running_app(["--weights", str(deit_tiny_path), "--mcp", "--no-warm-up", *EXPOSED_FLAGS]) as a:
        yield a


LESSON_SEED = 3
# The Clever-Hans lesson at CI size (test_survey, test_atlas): the hard default set at 32 px, 60
# pictures a class (192 to train on), and train's flags for a short run: 40 epochs of batch 16 at
# lr 2e-3 (about 25 CPU-seconds a model). Tuned on seeds 1, 2, 3 (each: all the marked circles of
# the test set in one survey cluster, 81-98 % of its prototype on the mark); at lr 1e-3, or 25
# epochs of 80 a class, some seeds had not yet learned the mark. In fp32, as tuned: --precision auto
# would train in bf16 on a CPU that has it, and the lesson would differ from machine to machine.
LESSON_TRAIN = ("--epochs", "40", "--batch-size", "16", "--lr", "0.002", "--seed", str(LESSON_SEED), "--precision", "fp32")


@pytest.fixture(scope="session")
def lesson_models(tmp_path_factory) -> Path:
    """Both models of the lesson, trained at once by the train command (one thread each), in one
    folder: ``wm.safetensors`` (90 % of the circles marked in the bottom-left corner) and
    ``clean.safetensors`` (the same pictures unmarked), and the test sets they never saw (another
    seed) ``test/`` (marked) and ``test-clean/``."""
    import subprocess
    import sys

    from vit_demo.train.data import Shortcut, make_shapes

    root = tmp_path_factory.mktemp("lesson")
    make_shapes(root / "wm", per_class=60, seed=LESSON_SEED, progress=False, shortcut=Shortcut())
    make_shapes(root / "clean", per_class=60, seed=LESSON_SEED, progress=False)
    make_shapes(root / "test", per_class=30, seed=LESSON_SEED + 1000, progress=False, shortcut=Shortcut())
    make_shapes(root / "test-clean", per_class=30, seed=LESSON_SEED + 1000, progress=False)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    runs = {name: subprocess.Popen([sys.executable, "-m", "vit_demo", "train", "--data", str(root / name), "--out",
                                    str(root / f"{name}.safetensors"), *LESSON_TRAIN, "--no-progress", "--json"],
                                   cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for name in ("wm", "clean")}
    for p in runs.values():
        _, err = p.communicate(timeout=900)
        assert p.returncode == 0, err[-3000:]
    return root


def decisive_tiny_vit() -> VisionTransformer:
    """A 32 x 32 px, 4 x 4-patch random ViT, nudged off PyTorch's init, with a decisive head (the class
    probabilities react to hidden patches well above float32's resolution): the masked-pass methods' tests."""
    torch.manual_seed(0)
    model = VisionTransformer(ViTConfig(img_size=(32, 32), patch_size=8, embed_dim=32, depth=2, num_heads=2,
                                        num_classes=5)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
        model.head.weight.mul_(4)
    return model


# ----------------------------------------------------------------------------- small models and inputs shared by test files

TOKEN_VARIANTS = {  # random small timm models: register tokens + LayerScale, no [class] token, a distillation token
    "vit_small_patch14_reg4_dinov2": {"img_size": 224},
    "vit_base_patch16_reg4_gap_256": {"img_size": 224},
    "deit_tiny_distilled_patch16_224": {},
}
NARROW_TIMM = {"depth": 2, "embed_dim": 96, "num_heads": 3, "num_classes": 10}


@pytest.fixture(scope="module", params=list(TOKEN_VARIANTS))
def small_pair(request):
    """Each of :data:`TOKEN_VARIANTS` narrowed (:data:`NARROW_TIMM`): (its name, timm's random model,
    the scratch model on the same weights, 4 random inputs [4, 3, 224, 224])."""
    import timm

    from vit_demo.checkpoints.timm import from_timm

    torch.manual_seed(0)
    tm = timm.create_model(request.param, pretrained=False, **NARROW_TIMM, **TOKEN_VARIANTS[request.param]).eval()
    model, _ = from_timm(tm)
    x = torch.randn(4, 3, 224, 224, generator=torch.Generator().manual_seed(1))
    return request.param, tm, model, x


def perturbed_timm(name: str, seed: int = 0, **kwargs) -> torch.nn.Module:
    """timm's random init, then every parameter moved by noise so that tokens, LayerScale and
    norms (which timm initialises to ~0 or 1) all matter to the output."""
    import timm

    torch.manual_seed(seed)
    tm = timm.create_model(name, pretrained=False, **kwargs).eval()
    with torch.no_grad():
        for p in tm.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return tm


def load_photos(lm, paths, size=None) -> torch.Tensor:
    """The pictures at ``paths`` as ``lm``'s model inputs [n, 3, H, W] (at ``size`` when given)."""
    from vit_demo.images import load_image
    from vit_demo.preprocess import preprocess

    dc = lm.data_config if size is None else lm.data_config.with_size(size)
    return torch.stack([preprocess(load_image(p), dc)[0] for p in paths])


def noise_photos(folder: Path, n: int, seed: int) -> list[Path]:
    """``n`` 64 x 48 PNGs of uniform noise in ``folder`` (a different picture each: no cache answers for
    another), named by ``seed`` so that calls with other seeds never overwrite each other."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        p = folder / f"p{seed}_{i}.png"
        Image.fromarray(rng.integers(0, 256, (48, 64, 3), dtype=np.uint8)).save(p)
        out.append(p)
    return out


SHAPE_CLASSES = ["circle", "square", "star", "triangle"]


def random_shapes_checkpoint(path: Path) -> Path:
    """A random scratch model (the default recipe at 32 px, its head not all zeros) for the shapes'
    four classes, saved at ``path``."""
    from vit_demo.checkpoints.files import save
    from vit_demo.train.recipe import scratch_config, scratch_data_config

    torch.manual_seed(0)
    model = VisionTransformer(scratch_config(32, 4)).init_weights()
    torch.nn.init.normal_(model.head.weight, std=0.02)  # a head that is not all zeros
    return save(model, scratch_data_config(32), path, name="random", class_names=SHAPE_CLASSES)


def small_shapes_vit(seed: int = 0, depth: int = 3, **kwargs) -> VisionTransformer:
    """A small random ViT for 32-px shapes (8-px patches, width 16, 2 heads, the four classes),
    timm's init with a head large enough (std 0.5) that the classes differ; ``kwargs``: more of its config."""
    torch.manual_seed(seed)
    cfg = ViTConfig(img_size=(32, 32), patch_size=8, embed_dim=16, depth=depth, num_heads=2, num_classes=4, **kwargs)
    model = VisionTransformer(cfg).init_weights().eval()
    torch.nn.init.normal_(model.head.weight, std=0.5)
    return model
