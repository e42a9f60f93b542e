"""Does the atlas find a shortcut that a model does not need? Figures to quote, never assertions.

A model trained on shapes with a mark on most pictures of one class (``python -m vit_demo data shapes
--shortcut watermark --shortcut-class C --shortcut-corner X --shortcut-mark M``, then ``train`` at the
defaults, 4-px patches) is given a held-out set (seed 1, 30 a class) with the same mark. This script
says, for that model:

- the stamping test done by hand: how many of the other classes' *clean* pictures the model turns into
  the class once the mark is drawn on them (the shortcut is enough), and how many of the class's
  marked pictures it still calls the class without their mark (it is not needed);
- the atlas of the marked set at its defaults: the concept whose top patches sit on the mark, its
  rank for the class by removal alone (the atlas before), by addition, and by the larger of the two
  (the atlas now), whether it is flagged, and the share of the other pictures it turns;
- the survey of the same set: its flagged clusters.

    python benchmarks/bench_atlas_shortcut.py --weights M.safetensors --class circle --corner top-left \\
        --mark white [--precision fp32] [--json FILE]

``tests/data/README.md`` gives the recipe of the model the test uses; docs/atlas.md quotes this
script's figures for it and for an unlike one (another class, corner and mark).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def by_hand(lm: Any, clean: Path, cls: str, corner: str, mark: str) -> dict[str, int]:
    """The mark drawn on the other classes' clean pictures, and removed from the class's: the model's calls."""
    import torch

    from vit_demo.images import load_image
    from vit_demo.preprocess import preprocess
    from vit_demo.train.data import add_watermark

    target = lm.labels.index(cls)
    classes = sorted(p.name for p in clean.iterdir() if p.is_dir())
    others = [p for c in classes if c != cls for p in sorted((clean / c).glob("*.png"))]
    own = sorted((clean / cls).glob("*.png"))

    def calls(paths: list[Path], stamp: bool) -> np.ndarray:
        pics = [add_watermark(load_image(p), corner, mark)[0] if stamp else load_image(p) for p in paths]
        x = torch.stack([preprocess(p, lm.data_config)[0] for p in pics])
        with torch.no_grad():
            return lm.model(x).logits.float().argmax(1).numpy()

    return {"others": len(others), "others_called_class_clean": int((calls(others, False) == target).sum()),
            "others_called_class_marked": int((calls(others, True) == target).sum()),
            "own": len(own), "own_called_class_clean": int((calls(own, False) == target).sum()),
            "own_called_class_marked": int((calls(own, True) == target).sum())}


def rank(by_id: dict[int, dict[str, Any]], key: str, cls: str, k: int) -> int:
    """1-based rank of concept ``k`` for ``cls`` by ``key`` (removal, addition, importance)."""
    order = sorted(by_id, key=lambda i: -(by_id[i][key][cls] if by_id[i][key][cls] is not None else -np.inf))
    return order.index(k) + 1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--weights", required=True)
    ap.add_argument("--class", dest="cls", default="circle", help="the class that carries the mark")
    ap.add_argument("--corner", default="top-left")
    ap.add_argument("--mark", default="white")
    ap.add_argument("--precision", default="auto")
    ap.add_argument("--json", help="write the figures here too")
    args = ap.parse_args()

    from vit_demo.checkpoints.load import load_model
    from vit_demo.evaluate.atlas import atlas
    from vit_demo.evaluate.geometry import cell_coverage
    from vit_demo.evaluate.survey import survey
    from vit_demo.train.data import Shortcut, make_shapes, watermark_box

    lm = load_model(weights=args.weights, device="cpu", progress=False, precision=args.precision)
    out: dict[str, Any] = {"weights": Path(args.weights).name, "class": args.cls, "corner": args.corner,
                           "mark": args.mark, "precision": args.precision, "load_before": os.getloadavg()[0]}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        mark = Shortcut(target=args.cls, corner=args.corner, mark=args.mark)
        make_shapes(work / "test", per_class=30, seed=1, progress=False, shortcut=mark)
        make_shapes(work / "clean", per_class=30, seed=1, progress=False)
        out["by_hand"] = by_hand(lm, work / "clean", args.cls, args.corner, args.mark)
        t = time.process_time()
        res = atlas(lm, work / "test", progress=False, batch_size=60)
        out["atlas_cpu_s"] = round(time.process_time() - t, 1)
        on = cell_coverage(watermark_box(32, args.corner), (32, 32), tuple(res["grid"])).numpy() > 0
        by_id = {c["id"]: c for c in res["concepts"]}
        share = {k: float(np.mean([on[t["row"], t["col"]] for t in c["top"]])) for k, c in by_id.items()}
        k = max(share, key=share.get)
        c = by_id[k]
        out["concept"] = {"id": k, "top_patches_on_mark": share[k], "of": len(by_id),
                          "removal": c["removal"][args.cls], "rank_removal": rank(by_id, "removal", args.cls, k),
                          "addition": c["addition"][args.cls], "rank_addition": rank(by_id, "addition", args.cls, k),
                          "importance": c["importance"][args.cls],
                          "rank_importance": rank(by_id, "importance", args.cls, k),
                          "turned": c["turned"][args.cls], "top_for": c["top_for"], "flagged": c["suspicious"]}
        out["flagged_concepts"] = [(f["id"], f["top_for"]) for f in res["findings"]["suspicious_concepts"]]
        sv = survey(lm, work / "test", progress=False)
        out["survey_flags"] = [(f["class"], f["place"]) for f in sv["findings"]["suspicious_clusters"]]
    out["load_after"] = os.getloadavg()[0]
    print(json.dumps(out, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
