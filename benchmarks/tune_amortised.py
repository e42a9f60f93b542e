"""The cheap routes to causal LRP's faithfulness tried in the third round of issue 32 (not a test:
tables to quote in docs/faithfulness.md). Causal LRP is the gated LRP map times each patch's
effect measured with 256 masked forward passes (vit_demo/methods/perturb.py); these runs ask
whether that effect can be had for a handful of passes.

- ``teacher``: per photo, the single-pass maps, the final tokens and causal LRP's test of the
  gated map with both replacements (its 256 masks filled with the mean colour, then with a blur,
  sigma 8 px; bfloat16 passes), saved as one file per photo: the data the others read;
- ``masks``: the gated map times the effect estimated from the first of every k masks (32, 64,
  128 of each replacement): how many masked passes the test needs before it helps;
- ``student``: an amortised explainer (Covert et al., ICLR 2023, in spirit): small models trained
  on the training photos to predict the measured effect from the single-pass maps (per patch,
  with 3x3 neighbours; a per-patch MLP, a small convolution, a listwise loss) or from the final
  tokens times the class's head weights (ridge regression), scored on the validation photos:
  rank correlation with the measured effect, and SRG / SaCo of the gated map times the prediction;
- ``path``: path-probed LRP (vit_demo/methods/probe.py, ``lrp-path``) with its 15 probes filled
  with the mean colour, with a blur, or both (30 passes);
- ``export``: the per-patch MLP without the AttnLRP inputs (the slowest single-pass map), five seeds
  averaged, trained on every training photo the teacher has made: the weights of ``lrp-amortised``
  (vit_demo/methods/amortised.py, written to vit_demo/methods/amortised.safetensors);
- ``heldout``: ``lrp-amortised`` with those weights, scored once on the held-out photos, beside
  lrp-gated, lrp-probed and its seed without the probes.

Photos: the 1000 shared ImageNet photos in sorted order, by index mod 10: training = 1, 2, 4, 6, 7,
8, 9 (the first 270 of them for ``student``, all that ``teacher`` has made for ``export``: 328
here), validation = 5 (the tuning photos of the earlier rounds), held-out = 3 (``heldout`` only).
Scores: vit_demo.evaluate.srg_saco (deletion, insertion, SRG, SaCo,
one grid row per step, mean colour and blur sigma 10 px), true label, embedded DeiT-Tiny.

    python benchmarks/tune_amortised.py teacher --split train|val|heldout [--limit N] [--shard k/n] [--data DIR]
    python benchmarks/tune_amortised.py masks|student|path|export|heldout [--limit N] [--data DIR]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
SAMPLE = Path(os.environ.get("VIT_DEMO_SHARED", ROOT.parent / "shared")) / "imagenet-sample"
SPLITS = {"train": (1, 2, 4, 6, 7, 8, 9), "val": (5,), "heldout": (3,)}
MAPS = ("lrp", "attnlrp", "lrp-gated", "grad-rollout", "chefer", "gradcam", "rollout", "attention")
PROBE_SIGMA = 8.0  # the blur the probes use (the scores use srg_saco's 10 px)


@cache
def sample() -> list[Path]:
    files = sorted(SAMPLE.glob("*.JPEG"))
    if len(files) != 1000:
        raise SystemExit(f"needs the 1000-photo ImageNet sample at {SAMPLE}")
    return files


def photos(split: str) -> list[tuple[int, Path]]:
    return [(i, f) for i, f in enumerate(sample()) if i % 10 in SPLITS[split]]


def load_input(lm, path: Path):
    from vit_demo.images import load_image
    from vit_demo.preprocess import preprocess

    img = load_image(path)
    return preprocess(img, lm.input_config(img.size))[0][None]


def teacher(lm, split: str, limit: int, shard: str, data: Path) -> None:
    """One file per photo: the single-pass maps, tokens, and causal LRP's test with both fills."""
    import torch

    from vit_demo import methods
    from vit_demo.evaluate.srg_saco import gaussian_blur
    from vit_demo.methods.passes import masked_scores
    from vit_demo.methods.perturb import CausalSettings, patch_effects, seeded_masks

    model, wnids = lm.model, sorted({p.name.split("_")[0] for p in sample()})
    k, n = (int(v) for v in shard.split("/"))
    data.mkdir(parents=True, exist_ok=True)
    for i, path in photos(split)[: limit or None][k::n]:
        dst = data / f"{i:04d}.pt"
        if dst.exists():
            continue
        t0, x = time.perf_counter(), load_input(lm, path)
        label = wnids.index(path.name.split("_")[0])
        t = torch.tensor([label])
        with torch.no_grad():
            tokens = model.forward_features(x)[0][0]
        with methods.reuse(model, x):
            maps = {name: methods.get(name)(model, x, t)[0].detach().float() for name in MAPS}
        shown, stratum = seeded_masks(maps["lrp-gated"][None], CausalSettings())
        rec = {"index": i, "label": label, "tokens": tokens.half(), "maps": maps, "effects": {},
               "shown": shown[0].flatten(1).to(torch.uint8)}
        with torch.autocast("cpu", dtype=torch.bfloat16):
            for kind, fill in (("mean", None), ("blur", gaussian_blur(x, PROBE_SIGMA))):
                scores = masked_scores(model, x, shown, t, 32, "masks", fill=fill)
                rec["effects"][kind] = patch_effects(scores, shown, stratum)[0]
                rec[f"scores_{kind}"] = scores[0].half()
        torch.save(rec, dst)
        print(f"{i} {path.name} {time.perf_counter() - t0:.1f} s", flush=True)


def records(data: Path, split: str, limit: int) -> list[dict]:
    import torch

    recs = [torch.load(data / f"{i:04d}.pt", weights_only=False) for i, _ in photos(split) if (data / f"{i:04d}.pt").exists()]
    if not recs:
        raise SystemExit(f"no teacher data for the {split} photos in {data}: run 'teacher --split {split}' first")
    return recs[: limit or None]


def unit(t):
    f = t.flatten()
    f = f - f.min()
    return (f / f.max().clamp(min=1e-12)).reshape(t.shape)


def zscore(t):
    return (t - t.mean()) / t.std().clamp(min=1e-12)


def both_effects(rec: dict, every: int = 1):
    """The effect from every ``every``-th mask of each replacement, z-scored per kind, summed."""
    import torch

    from vit_demo.methods.perturb import CausalSettings, patch_effects, seeded_masks

    stratum = seeded_masks(torch.zeros(1, 14, 14), CausalSettings())[1][::every]
    shown = rec["shown"].bool().reshape(1, 256, 14, 14)[:, ::every]
    return sum(zscore(patch_effects(rec[f"scores_{kind}"].float()[None, ::every], shown, stratum)[0])
               for kind in ("mean", "blur"))


def gated_times(rec: dict, factor):
    return unit(rec["maps"]["lrp-gated"].clamp(min=0)) * unit(factor)


def score(lm, recs: list[dict], maps: dict[str, list], batch: int = 4) -> None:
    """SRG / SaCo of every map (lists aligned with ``recs``), paired against the first one."""
    import numpy as np
    import torch

    from vit_demo.evaluate.srg_saco import KINDS, measures

    names = list(maps)
    got = {k: {n: {"srg": [], "saco": []} for n in names} for k in KINDS}
    for s in range(0, len(recs), batch):
        rs = recs[s : s + batch]
        x = torch.cat([load_input(lm, sample()[r["index"]]) for r in rs])
        t = torch.tensor([r["label"] for r in rs])
        ms = [torch.stack(maps[n][s : s + len(rs)]) for n in names]
        for kind in KINDS:
            out = measures(lm.model, x, ms, t, kind)
            for k, n in enumerate(names):
                for m in ("srg", "saco"):
                    got[kind][n][m] += out[m][:, k].tolist()
    print(f"{len(recs)} photos, load average {os.getloadavg()[0]:.1f}")
    for kind in KINDS:
        base = {m: np.array(got[kind][names[0]][m]) for m in ("srg", "saco")}
        print(f"| {kind} | SRG | SaCo | SRG - {names[0]} | SaCo - {names[0]} |\n|---|---|---|---|---|")
        for n in names:
            a = {m: np.array(got[kind][n][m]) for m in ("srg", "saco")}
            d = {m: a[m] - base[m] for m in a}
            se = {m: d[m].std() / np.sqrt(len(d[m])) for m in d}
            print(f"| {n} | {a['srg'].mean():.3f} | {a['saco'].mean():.3f} | {d['srg'].mean():+.4f} ± {se['srg']:.4f} "
                  f"| {d['saco'].mean():+.3f} ± {se['saco']:.3f} |")


def masks(lm, data: Path, limit: int) -> None:
    recs = records(data, "val", limit)
    maps = {"lrp-gated": [r["maps"]["lrp-gated"] for r in recs]}
    for every in (8, 4, 2, 1):
        maps[f"x effect, {256 // every} + {256 // every} masks"] = [gated_times(r, both_effects(r, every)) for r in recs]
    score(lm, recs, maps)


def features(rec: dict, names: tuple[str, ...] = MAPS):
    """[C, 14, 14]: every single-pass map scaled by its largest magnitude and as ranks, their 3x3
    means and maxima."""
    import torch
    import torch.nn.functional as F

    chans = []
    for name in names:
        m = rec["maps"][name]
        chans += [m / m.abs().amax().clamp(min=1e-12), m.flatten().argsort().argsort().float().reshape(m.shape) / 195]
    X = torch.stack(chans)[None]
    return torch.cat([X, F.avg_pool2d(X, 3, 1, 1, count_include_pad=False), F.max_pool2d(X, 3, 1, 1)], 1)[0]


def fit(X, Y, conv: bool, listwise: bool, epochs: int = 150, seed: int = 0):
    """A small model [P, C, 14, 14] -> [P, 14, 14] trained on (X, Y), inputs standardised; returns
    the prediction function."""
    import torch
    from torch import nn

    torch.manual_seed(seed)
    mu, sd = X.mean((0, 2, 3), keepdim=True), X.std((0, 2, 3), keepdim=True).clamp(min=1e-6)
    mid = nn.Conv2d(32, 32, 3, padding=1) if conv else nn.Conv2d(32, 32, 1)
    net = nn.Sequential(nn.Conv2d(X.shape[1], 32, 1), nn.GELU(), mid, nn.GELU(), nn.Conv2d(32, 1, 1))
    train(net, (X - mu) / sd, Y, listwise, epochs)
    return lambda Z: net((Z - mu) / sd)[:, 0].detach()


def train(net, Z, Y, listwise: bool = False, epochs: int = 150) -> None:
    """AdamW on standardised inputs Z [P, C, 14, 14] for targets Y [P, 14, 14], batches of 64."""
    import torch

    opt = torch.optim.AdamW(net.parameters(), lr=3e-3, weight_decay=1e-4)
    for _ in range(epochs):
        for idx in torch.randperm(len(Z)).split(64):
            p = net(Z[idx])[:, 0]
            if listwise:
                loss = -(Y[idx].flatten(1).softmax(-1) * p.flatten(1).log_softmax(-1)).sum(-1).mean()
            else:
                loss = ((p - Y[idx]) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()


def package_features(recs: list[dict]):
    """The registered method's inputs (vit_demo.methods.amortised.features) from the teacher's maps."""
    import torch

    from vit_demo.methods.amortised import INPUTS
    from vit_demo.methods.amortised import features as inputs

    return torch.cat([inputs({n: r["maps"][n][None] for n in INPUTS}) for r in recs])


def export(lm, data: Path, limit: int) -> None:
    """Train ``lrp-amortised``'s predictor on every training photo (five seeds) and write its weights."""
    import torch
    from safetensors.torch import save_file

    from vit_demo.methods.amortised import WEIGHTS, EffectPredictor, effect_net, load_predictor

    recs = records(data, "train", limit)
    X, Y = package_features(recs), torch.stack([both_effects(r) for r in recs])
    predictor = EffectPredictor(5)
    predictor.mean.copy_(X.mean((0, 2, 3), keepdim=True))
    predictor.std.copy_(X.std((0, 2, 3), keepdim=True).clamp(min=1e-6))
    for seed in range(len(predictor.nets)):
        torch.manual_seed(seed)
        predictor.nets[seed] = effect_net()
        train(predictor.nets[seed], (X - predictor.mean) / predictor.std, Y)
    state = {k: v.contiguous() for k, v in predictor.state_dict().items()}
    save_file(state, str(WEIGHTS), metadata={"photos": str(len(recs)), "model": "deit_tiny_patch16_224 (shipped)",
                                             "made_by": "benchmarks/tune_amortised.py export"})
    load_predictor(WEIGHTS)
    print(f"{WEIGHTS}: {sum(v.numel() for v in state.values())} numbers, trained on {len(recs)} photos")


def rank_correlation(P, Y) -> float:
    from scipy.stats import spearmanr

    return sum(spearmanr(p.flatten(), y.flatten())[0] for p, y in zip(P, Y)) / len(P)


def student(lm, data: Path, limit: int) -> None:
    import torch
    from sklearn.linear_model import Ridge

    train, val = records(data, "train", 0), records(data, "val", limit)
    Xt, Yt = torch.stack([features(r) for r in train]), torch.stack([both_effects(r) for r in train])
    Xv, Yv = torch.stack([features(r) for r in val]), torch.stack([both_effects(r) for r in val])
    W = lm.model.head.weight.detach()

    def tokens(r):  # [196, 192 + 5]: each patch's final token times the class's head weights, and five maps as ranks
        ranks = [r["maps"][n].flatten().argsort().argsort().float() / 195 for n in MAPS[:6] if n != "attnlrp"]
        return torch.cat([r["tokens"][1:].float() * W[r["label"]], torch.stack(ranks, 1)], 1)

    ridge = Ridge(alpha=1000).fit(torch.cat([tokens(r) for r in train]).numpy(), Yt.flatten().numpy())
    preds = {"MLP": fit(Xt, Yt, False, False)(Xv), "convolution": fit(Xt, Yt, True, False)(Xv),
             "MLP, listwise": fit(Xt, Yt, False, True)(Xv),
             "ridge on tokens": torch.stack([torch.tensor(ridge.predict(tokens(r).numpy())).float().reshape(14, 14)
                                             for r in val])}
    print(f"{len(train)} training photos, {len(val)} validation photos; rank correlation with the measured effect:")
    print(f"lrp-gated itself: {rank_correlation(Xv[:, 4], Yv):.3f}")
    for name, P in preds.items():
        print(f"{name}: {rank_correlation(P, Yv):.3f}")
    maps = {"lrp-gated": [r["maps"]["lrp-gated"] for r in val]}
    maps |= {f"x {name}": [gated_times(r, P[j]) for j, r in enumerate(val)] for name, P in preds.items()}
    score(lm, val, maps)


def path(lm, data: Path, limit: int) -> None:
    import torch

    from vit_demo.evaluate.srg_saco import gaussian_blur
    from vit_demo.methods.passes import masked_scores
    from vit_demo.methods.perturb import unit_range
    from vit_demo.methods.probe import rank_groups

    G, recs = 8, records(data, "val", limit)
    maps: dict[str, list] = {"lrp-gated": [], "path, mean": [], "path, blur": [], "path, both": []}
    for r in recs:
        x, t, seed = load_input(lm, sample()[r["index"]]), torch.tensor([r["label"]]), r["maps"]["lrp-gated"]
        with torch.no_grad():
            clean = lm.model(x).logits.softmax(-1)[:, r["label"]].double()[:, None]
        group = rank_groups(seed[None], G)
        upto = group[:, None, :] < torch.arange(G)[:, None]
        probes = torch.cat([upto, ~upto[:, 1:]], dim=1).reshape(1, -1, 14, 14)
        effect = {}
        for kind, fill in (("mean", None), ("blur", gaussian_blur(x, PROBE_SIGMA))):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                sc = masked_scores(lm.model, x, probes, t, 16, "probes", fill=fill).double()
            shown, hidden = torch.cat([sc[:, :G], clean], 1), torch.cat([clean, sc[:, G:], sc[:, :1]], 1)
            effect[kind] = (shown[:, 1:] - shown[:, :-1]) + (hidden[:, :-1] - hidden[:, 1:])
        effect["both"] = effect["mean"] + effect["blur"]
        maps["lrp-gated"].append(seed)
        for kind, e in effect.items():
            factor = 0.05 + unit_range(e[:, :, None]).squeeze(-1).float().gather(1, group).reshape(1, 14, 14)
            maps[f"path, {kind}"].append((unit_range(seed.clamp(min=0)[None]) * factor)[0])
    score(lm, recs, maps)


def probed(lm, rec: dict, seed):
    """Probed LRP's factor (8 rank groups of ``seed``, each hidden once, mean colour) on ``seed``."""
    import torch

    from vit_demo.methods.probe import probe_seed

    x, t = load_input(lm, sample()[rec["index"]]), torch.tensor([rec["label"]])
    with torch.no_grad():
        clean = lm.model(x).logits.float().softmax(-1)[:, rec["label"]]
        return probe_seed(lm.model, x, t, clean, seed[None])[0]


def heldout(lm, data: Path, limit: int) -> None:
    """The registered lrp-amortised (its shipped weights) on the held-out photos, beside lrp-gated, lrp-probed
    and its seed without the probes; the maps from the teacher's files (the same maps the methods give)."""
    import torch

    from vit_demo.methods.amortised import INPUTS, amortised_seed, predictor

    held = records(data, "heldout", limit)
    P = predictor()(package_features(held))
    Yh = torch.stack([both_effects(r) for r in held])
    print(f"{len(held)} held-out photos; rank correlation with the measured effect: lrp-gated "
          f"{rank_correlation(torch.stack([r['maps']['lrp-gated'] for r in held]), Yh):.3f}, prediction "
          f"{rank_correlation(P, Yh):.3f}")
    seeds = [amortised_seed({n: r["maps"][n][None] for n in INPUTS})[0] for r in held]
    score(lm, held, {"lrp-gated": [r["maps"]["lrp-gated"] for r in held],
                     "lrp-probed": [probed(lm, r, r["maps"]["lrp-gated"]) for r in held],
                     "seed (gated x prediction)": seeds,
                     "lrp-amortised": [probed(lm, r, m) for r, m in zip(held, seeds)]})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run", choices=("teacher", "masks", "student", "path", "export", "heldout"))
    ap.add_argument("--split", choices=list(SPLITS), default="train", help="teacher: whose photos")
    ap.add_argument("--limit", type=int, default=0, help="the split's first N photos (0: all)")
    ap.add_argument("--shard", default="0/1", help="teacher: k/n, every n-th photo from the k-th (parallel runs)")
    ap.add_argument("--data", type=Path, default=Path("amortised-data"), help="the teacher's files")
    args = ap.parse_args()
    from vit_demo.checkpoints.load import load_model

    lm = load_model(progress=False)
    lm.model.eval()
    if args.run == "teacher":
        teacher(lm, args.split, args.limit, args.shard, args.data)
    else:
        runs = {"masks": masks, "student": student, "path": path, "export": export, "heldout": heldout}
        runs[args.run](lm, args.data, args.limit)


if __name__ == "__main__":
    main()
