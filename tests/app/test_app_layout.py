"""Where code lives: Gradio only in the app package, the registry / session / renderers free of
it, and ``vit_demo.viz`` still offering every name it had as one module."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

VIZ_NAMES = [  # vit_demo.viz's public names when it was one file (viz.py), before the split
    "ACCENT", "FIGURE_FORMATS", "HIGHLIGHT", "LABEL_SIZE", "MUTED_COLOR", "PANEL_TITLE_SIZE", "Picture", "TEXT_COLOR",
    "TICK_SIZE", "TITLE_SIZE", "TOKEN_COLORS", "as_array", "check_cmap", "colorize", "colormap_lut", "compare_figure",
    "distance_figure", "figure_to_image", "heads_figure", "heads_image", "heatmap_figure", "normalize",
    "overlay_image", "patch_grid_figure", "patch_grid_image", "patch_index_at", "picture_array", "pos_embed_figure",
    "save_figure", "text_font", "text_width", "topk_figure", "uniform_attention_distance", "upsample",
]


def imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    return names


def test_gradio_only_in_the_app() -> None:
    app = ROOT / "vit_demo" / "app"
    outside = [p.relative_to(ROOT).as_posix() for p in sorted((ROOT / "vit_demo").rglob("*.py"))
               if app not in p.parents and "gradio" in imported_modules(p)]
    assert outside == [], f"Gradio imported outside vit_demo/app/: {outside}"
    assert "gradio" in imported_modules(app / "build.py")  # the scan sees imports (it can fail)


def test_registry_session_and_renderers_load_without_gradio() -> None:
    code = ("import sys\n"
            "import vit_demo.app, vit_demo.app.registry, vit_demo.app.session, vit_demo.viz, vit_demo.analysis\n"
            "print('gradio' in sys.modules)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "False"


def test_viz_reexports_every_old_name() -> None:
    from vit_demo import viz

    assert [n for n in VIZ_NAMES if not hasattr(viz, n)] == []
    assert set(VIZ_NAMES) <= set(viz.__all__)
