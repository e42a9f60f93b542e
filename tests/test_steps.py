"""Step inside (vit_demo.inside, Model.steps, the steps command): one picture through the ViT, step by
step, every number the model's own.

- on the shipped DeiT-Tiny: the values chain from the image to the logits (each step recomputed
  from the one before within 1e-5, with the shipped weights), q, k, v and the logits equal timm's,
  the attention row equals ``Model.attention``'s, every step draws a PNG;
- on a tiny model of every kind of embedding, position, attention, block and readout the model
  package builds: the same chain, the family's own step where it differs, a step the model lacks
  said so;
- a bad request is one line naming the allowed range, before any forward pass; a model whose hook
  point stays silent names the missing step; nothing imports Gradio.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import safetensors.torch
import torch
from conftest import DEIT_TINY, ROOT
from skimage import data
from test_hook_points import KINDS

from vit_demo.api.model import Model
from vit_demo.cli.main import main
from vit_demo.inside import STEPS, TEMPERATURE_RANGE, StepError, clamp_temperature, step_through
from vit_demo.model import PARTS, VisionTransformer, ViTConfig

PNG = b"\x89PNG\r\n\x1a\n"
TOL = dict(rtol=1e-5, atol=1e-5)


def softmax(s: np.ndarray, t: float = 1.0) -> np.ndarray:
    return torch.softmax(torch.from_numpy(np.asarray(s, dtype=np.float32)) / t, -1).numpy()


# ----------------------------------------------------------------------------- the shipped DeiT-Tiny

@pytest.fixture(scope="module")
def api(deit_tiny) -> Model:
    return Model(deit_tiny)


@pytest.fixture(scope="module")
def photo() -> np.ndarray:
    return data.chelsea()


@pytest.fixture(scope="module")
def steps(api, photo):
    return api.steps(photo, patch=(5, 9), layer=7, head=2)


def test_deit_steps_have_titles_texts_and_pictures(steps):
    assert len(steps) == len(STEPS) >= 8 and [s.name for s in steps] == list(STEPS)
    assert (steps.patch, steps.token, steps.layer, steps.head, steps.temperature) == ((5, 9), 80, 7, 2, 1.0)
    for s in steps:
        assert s.exists and len(s.title) > 5 and len(s.text) > 40, s.name
        assert s._repr_png_().startswith(PNG)
    assert "q . k / sqrt(64) = q . k / 8" in steps["scores"].text and "layer 8, head 3" in steps["qkv"].title
    assert "the model's own attention" in steps["softmax"].text
    assert "<img" in steps._repr_html_()


def test_deit_values_chain_with_the_shipped_weights(steps):
    v, w = steps.values, safetensors.torch.load_file(str(DEIT_TINY))
    image = v["image"]
    assert image.shape == (3, 224, 224)
    np.testing.assert_array_equal(v["pixels"], image[:, 80:96, 144:160])  # rows 5*16.., columns 9*16..
    np.testing.assert_array_equal(v["patch_vector"], v["pixels"].reshape(-1))  # channel-first, the weight's order
    W, b = w["patch_embed.proj.weight"].reshape(192, -1).numpy(), w["patch_embed.proj.bias"].numpy()
    np.testing.assert_allclose(v["embedding"], W @ v["patch_vector"] + b, **TOL)
    np.testing.assert_array_equal(v["position"], w["pos_embed"][0, 80].numpy())  # [class] first, then row-major patches
    np.testing.assert_allclose(v["token"], v["embedding"] + v["position"], **TOL)
    pos = w["pos_embed"][0, 1:].numpy()
    pos /= np.linalg.norm(pos, axis=-1, keepdims=True)
    np.testing.assert_allclose(v["position_similarity"].reshape(-1), pos @ pos[79], **TOL)
    assert v["position_similarity"][5, 9] == pytest.approx(1.0)
    assert v["query"].shape == (64,) and v["keys"].shape == v["values"].shape == (197, 64)
    np.testing.assert_allclose(v["scores"], v["keys"] @ v["query"] / 8, **TOL)
    np.testing.assert_allclose(v["attention"], softmax(v["scores"]), **TOL)
    np.testing.assert_allclose(v["head_output"], v["attention"] @ v["values"], **TOL)
    assert v["lens"].shape == (12, 1000) and v["logits"].shape == (1000,) and v["residual_norms"].shape == (13,)
    np.testing.assert_allclose(v["lens"][-1], v["logits"], **TOL)


def test_deit_block_chains_through_its_own_modules(deit_tiny, steps):
    """norm1 -> the query; norm2 -> the MLP's hidden layer; + fc2 -> the next block's stream: the
    block's own modules on the walk's values give the walk's next values."""
    v, block = steps.values, deit_tiny.model.blocks[7]
    t = lambda a: torch.from_numpy(np.asarray(a))  # noqa: E731
    with torch.no_grad():
        np.testing.assert_allclose(v["block_input"], v["stream"][7], **TOL)
        np.testing.assert_allclose(v["normed"], block.norm1(t(v["block_input"])).numpy(), **TOL)
        q = block.attn.qkv(t(v["normed"]))[2 * 64:3 * 64].numpy()  # q of head 2 (q, k, v, heads within)
        np.testing.assert_allclose(v["query"], q, **TOL)
        hidden = block.mlp.act(block.mlp.fc1(block.norm2(t(v["mid"]))))
        np.testing.assert_allclose(v["mlp_hidden"], hidden.numpy(), **TOL)
        np.testing.assert_allclose(v["stream"][8], (t(v["mid"]) + block.mlp.fc2(hidden)).numpy(), **TOL)
    np.testing.assert_allclose(v["residual_norms"], np.linalg.norm(v["stream"], axis=-1), **TOL)


def test_deit_query_keys_values_and_logits_equal_timms(steps, deit_tiny_timm):
    x = torch.from_numpy(steps.values["image"])[None]
    seen = []
    handle = deit_tiny_timm.blocks[7].attn.qkv.register_forward_hook(lambda _m, _a, out: seen.append(out))
    try:
        with torch.no_grad():
            logits = deit_tiny_timm(x)[0].numpy()
    finally:
        handle.remove()
    q, k, v = seen[0].reshape(1, 197, 3, 3, 64)[0].permute(1, 2, 0, 3)  # [3, heads, 197, 64]
    np.testing.assert_allclose(steps.values["query"], q[2, 80].numpy(), **TOL)
    np.testing.assert_allclose(steps.values["keys"], k[2].numpy(), **TOL)
    np.testing.assert_allclose(steps.values["values"], v[2].numpy(), **TOL)
    np.testing.assert_allclose(steps.values["logits"], logits, rtol=0, atol=1e-4)
    np.testing.assert_allclose(steps.values["lens"][-1], logits, rtol=0, atol=1e-4)


def test_deit_attention_row_is_the_attention_results(api, photo, steps):
    maps = api.attention(photo).maps
    np.testing.assert_allclose(steps.values["attention"], maps[7][2][80], rtol=0, atol=1e-7)


def test_temperature_reweights_the_softmax_only(api, photo, steps):
    hot = api.steps(photo, patch=(5, 9), layer=7, head=2, temperature=2.0)
    v = hot.values
    np.testing.assert_allclose(v["attention"], softmax(v["scores"], 2.0), **TOL)
    np.testing.assert_allclose(v["head_output"], v["attention"] @ v["values"], **TOL)
    for name in ("scores", "query", "keys", "logits", "mlp_hidden"):  # the rest stays the model's
        np.testing.assert_array_equal(v[name], steps.values[name])
    assert "NOT the model's attention" in hot["softmax"].text and "T = 2" in hot["softmax"].title
    back = hot.with_temperature(1)
    np.testing.assert_array_equal(back.values["attention"], steps.values["attention"])
    assert back["softmax"].text == steps["softmax"].text
    np.testing.assert_allclose(steps.with_temperature(0.5).values["attention"], softmax(v["scores"], 0.5), **TOL)
    assert clamp_temperature(0.01) == TEMPERATURE_RANGE[0] and clamp_temperature(1e9) == TEMPERATURE_RANGE[1]
    assert clamp_temperature(3) == 3.0


def test_default_patch_is_where_the_readout_looks_most(api, photo):
    steps = api.steps(photo, layer=-1)
    attention = api.attention(photo)
    assert steps.layer == 11
    r, c = divmod(int(attention.map(-1).argmax()), 14)
    assert steps.patch == (r, c) and "the one the model's readout attends to most" in steps["patches"].text
    record = json.loads(json.dumps(steps.to_json()))
    assert record["patch"] == [r, c] and len(record["values"]["attention"]) == 197
    assert "projection_weight" not in record["values"] and len(record["steps"]) == len(STEPS)


# ----------------------------------------------------------------------------- every family

EXTRA = {  # beyond the attention, MLP and block kinds of test_hook_points: embeddings, positions, readouts
    "naflex": dict(naflex=True, no_embed_class=True, pos_embed_grid=True, class_token=False, reg_tokens=1,
                   global_pool="avg"),
    "conv-stem": dict(conv_stem=True, class_token=False, global_pool="avg"),
    "no-position": dict(pos_embed=False, global_pool="max", class_token=False),
    "distilled-registers": dict(dist_token=True, reg_tokens=2),
    "clip-aimv2": dict(pre_norm=True, patch_bias=False, patch_norm=True, norm="rmsnorm", mlp="glu", act="gelu_tanh",
                       global_pool="avgmax", class_token=False, fc_norm=True),
    "headless": dict(num_classes=0),
    "sam-neck": dict(window_size=2, global_blocks=(1,), rel_pos="decomposed", class_token=False, global_pool="",
                     pos_embed_grid=True, num_classes=0, neck_chans=16),
    "diff-scaling": dict(block="scaling", diff_attn=True),
    "layer-scale-eva": dict(layer_scale=True, layer_scale_on_block=True, qv_bias=True, qkv_bias=False),
}
CONFIGS = {**KINDS, **EXTRA}


def tiny(kind: str) -> tuple[VisionTransformer, torch.Tensor]:
    torch.manual_seed(0)
    model = VisionTransformer(ViTConfig(**{**dict(img_size=(32, 48), patch_size=8, embed_dim=32, depth=2, num_heads=2,
                                                  num_classes=5), **CONFIGS[kind]})).eval()
    with torch.no_grad():  # zero-initialised tables, biases and LayerScales matter too
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model, torch.randn(1, 3, 32, 48, generator=torch.Generator().manual_seed(1))


def check_embedding(model: VisionTransformer, x: torch.Tensor, walk) -> None:
    """pixels, the vector the projection reads (in its own order), embedding = (norm of) W v + b, token."""
    v, cfg, (r, c) = walk.values, model.cfg, walk.patch
    p = cfg.patch_size
    np.testing.assert_array_equal(v["pixels"], x[0, :, r * p:(r + 1) * p, c * p:(c + 1) * p].numpy())
    with torch.no_grad():
        if cfg.naflex:  # row by row, each pixel's channels together
            want = v["pixels"].transpose(1, 2, 0).reshape(-1)
        elif cfg.conv_stem:  # the stem's channels at this cell
            want = model.patch_embed.stem(x)[0, :, r, c].numpy()
        else:
            want = v["pixels"].reshape(-1)
        np.testing.assert_allclose(v["patch_vector"], want, **TOL)
        e = torch.from_numpy(v["projection_weight"] @ v["patch_vector"] + v["projection_bias"])
        np.testing.assert_allclose(v["embedding"], model.patch_embed.norm(e).numpy(), **TOL)
    # with an absolute position the token is embedding + position; without, the embedding itself
    np.testing.assert_allclose(v["token"], v["embedding"] + v.get("position", 0.0), **TOL)


def check_attention(model: VisionTransformer, x: torch.Tensor, walk) -> None:
    """scores = keys . query / sqrt(D) (+ the relative bias; each half for differential attention),
    attention = softmax(scores) (softmax1 - lambda softmax2), = the captured map's row on the keys
    met, head_output = attention . values."""
    v = walk.values
    q, k, s = v["query"], v["keys"], np.asarray(v["scores"])
    scale = q.shape[-1] ** -0.5
    if s.ndim == 2:
        for i in (0, 1):
            np.testing.assert_allclose(s[i], k[i] @ q[i] * scale, **TOL)
        parts = softmax(s)
        np.testing.assert_allclose(v["attention"], parts[0] - float(v["lambda"]) * parts[1], **TOL)
        np.testing.assert_allclose(v["attention_parts"], parts, **TOL)
    else:
        np.testing.assert_allclose(s, k @ q * scale + v.get("bias", 0.0), **TOL)
        np.testing.assert_allclose(v["attention"], softmax(s), **TOL)
    np.testing.assert_allclose(v["head_output"], v["attention"] @ v["values"], **TOL)
    with torch.no_grad():
        out = model(x, capture=True)
    row = out.attentions[walk.layer][0, walk.head, walk.token].numpy()
    keys = v["key_tokens"]
    np.testing.assert_allclose(v["attention"][keys >= 0], row[keys[keys >= 0]], rtol=0, atol=1e-6)
    met = np.zeros(row.shape, bool)
    met[keys[keys >= 0]] = True
    assert not row[~met].any(), "the captured map has weight on a key the walk says the query never meets"
    if "query_unturned" in v:  # RoPE turns q and k: every pair, and so each vector, keeps its length
        assert not np.allclose(v["query_unturned"], q, atol=1e-4)
        np.testing.assert_allclose(np.linalg.norm(v["query_unturned"]), np.linalg.norm(q), **TOL)
        np.testing.assert_allclose(np.linalg.norm(v["keys_unturned"], axis=-1), np.linalg.norm(k, axis=-1), **TOL)
    if "bias" in v:
        assert np.abs(v["bias"]).max() > 1e-3


def check_readout(model: VisionTransformer, x: torch.Tensor, walk) -> None:
    v = walk.values
    np.testing.assert_allclose(v["residual_norms"], np.linalg.norm(v["stream"], axis=-1), **TOL)
    if model.cfg.num_classes:
        with torch.no_grad():
            logits = model(x).logits[0].numpy()
        np.testing.assert_allclose(v["logits"], logits, **TOL)
        np.testing.assert_allclose(v["lens"][-1], logits, **TOL)
        assert v["lens"].shape == (model.cfg.depth, model.cfg.num_classes)
    else:
        assert "lens" not in v and "logits" not in v
        assert not walk.step("lens").exists and "headless" in walk.step("lens").text
    if "readout" in v:  # each token's weight in what the classifier reads (differential: a difference of two)
        assert v["readout"].shape == (walk.facts.n_patches + len(walk.facts.prefix),)
        if not model.cfg.diff_attn:
            assert v["readout"].min() >= 0 and v["readout"].sum() == pytest.approx(1.0, abs=1e-5)


@pytest.mark.parametrize("kind", CONFIGS)
def test_every_family_steps_through(kind: str) -> None:
    model, x = tiny(kind)
    heads = model.cfg.num_heads * (2 if model.cfg.block == "things" else 1)
    for layer, head in ((0, heads - 1), (1, 0)):
        walk = step_through(model, x, patch=(3, 4), layer=layer, head=head)
        assert [s.name for s in walk.steps] == list(STEPS) and all(s.title and s.text for s in walk.steps)
        check_embedding(model, x, walk)
        check_attention(model, x, walk)
        check_readout(model, x, walk)
    for s in walk.steps:  # every step draws itself, a missing one as a card saying so
        img = walk.render(s.name)
        assert img.mode == "RGB" and img.width >= 250 and img.height >= 100, s.name


def test_each_family_says_what_it_does() -> None:
    said = {kind: step_through(*tiny(kind), patch=0, layer=0).steps for kind in
            ("rope", "beit", "relpos-rpn", "diff", "sam", "map", "naflex", "conv-stem", "no-position", "scaling",
             "things")}
    text = {k: {s.name: (s.text, s.exists) for s in v} for k, v in said.items()}
    assert "RoPE then turns q and k" in text["rope"]["qkv"][0] and "Rotary positions turn q and k" in text["rope"]["position"][0]
    for kind in ("beit", "relpos-rpn"):  # no position vector: the step exists no more, and says where positions went
        assert text[kind]["position"] == (text[kind]["position"][0], False) and "bias" in text[kind]["position"][0]
        assert "relative position bias" in text[kind]["scores"][0]
    assert "res-post" in text["relpos-rpn"]["qkv"][0]
    assert "lambda" in text["diff"]["softmax"][0] and "two halves" in text["diff"]["qkv"][0]
    assert "window" in text["sam"]["qkv"][0] and "relative position bias" in text["sam"]["scores"][0]
    assert "attention pool" in text["map"]["readout"][0]
    assert "NaFlex" in text["naflex"]["pixels"][0] and "mean of the" in text["naflex"]["readout"][0]
    assert "stem" in text["conv-stem"]["projection"][0]
    assert text["no-position"]["position"][1] is False and "not told" in said["no-position"][3].title
    assert "ViT-22B" in text["scaling"]["qkv"][0] and "branches" in text["things"]["qkv"][0]


def test_a_model_whose_point_stays_silent_names_the_missing_step() -> None:
    model, x = tiny("plain")
    attend = PARTS["kernel"]["attend"]
    model.blocks[1].attn.attend = lambda q, k, v, scale, capture, bias, rule, hook: attend(q, k, v, scale, capture, bias,
                                                                                            rule, None)
    step_through(model, x, layer=0)  # block 1 is untouched
    with pytest.raises(StepError, match=r"the step 'scores' is missing \(block 2's attention passed no scores"):
        step_through(model, x, layer=1)
    with pytest.raises(StepError, match="cannot step through a Linear"):
        step_through(torch.nn.Linear(3, 3), x)


@pytest.mark.parametrize("request_, message", [
    (dict(patch=(4, 0)), r"patch \(4, 0\) is outside the 4x6 patch grid: give \(row, col\) with rows 0..3 and columns 0..5"),
    (dict(patch=(0, -1)), "rows 0..3 and columns 0..5"),
    (dict(patch=24), r"or an index 0..23"),
    (dict(patch="a"), "outside the 4x6 patch grid"),
    (dict(layer=2), r"layer 2: this model has layers 0..1 \(counted from 0; -1 the last\)"),
    (dict(layer=-3), "layers 0..1"),
    (dict(layer=1.0), "layers 0..1"),
    (dict(head=2), r"head 2: this model has heads 0..1 in each layer"),
    (dict(head=True), "heads 0..1"),
    (dict(temperature=0), "temperature 0: give a finite number above 0"),
    (dict(temperature=-1.0), "finite number above 0"),
    (dict(temperature=float("inf")), "finite number above 0"),
    (dict(temperature=float("nan")), "finite number above 0"),
    (dict(temperature="hot"), "finite number above 0"),
])
def test_a_bad_request_is_one_line_and_nothing_runs(request_: dict, message: str) -> None:
    model, x = tiny("plain")
    calls = []
    model.register_forward_pre_hook(lambda *_: calls.append(1))
    with pytest.raises(StepError, match=message) as e:
        step_through(model, x, **request_)
    assert "\n" not in str(e.value) and not calls


# ----------------------------------------------------------------------------- the command, Gradio

def test_steps_command_writes_pictures_and_values(tmp_path, capsys, deit_tiny_path):
    from PIL import Image

    img = tmp_path / "cat.png"
    Image.fromarray(data.chelsea()).save(img)
    out = tmp_path / "walk"
    assert main(["steps", str(img), "--weights", str(deit_tiny_path), "--patch", "5", "9", "--layer", "7", "--head", "2",
                 "--json", "--out", str(out), "--scale", "1"]) == 0
    printed = capsys.readouterr()
    record = json.loads(printed.out)
    assert record["patch"] == [5, 9] and record["token"] == 80 and record["layer"] == 7 and record["head"] == 2
    assert len(record["values"]["attention"]) == 197 and sum(record["values"]["attention"]) == pytest.approx(1, abs=1e-5)
    pngs = sorted(out.glob("*.png"))
    assert [p.name for p in pngs] == [f"{i:02d}-{n}.png" for i, n in enumerate(STEPS, 1)]
    assert all(p.read_bytes().startswith(PNG) for p in pngs) and "wrote 13 pictures" in printed.err
    saved = np.load(out / "values.npz")
    assert saved["projection_weight"].shape == (192, 768) and json.loads((out / "steps.json").read_text()) == record
    assert main(["steps", str(img), "--weights", str(deit_tiny_path), "--temperature", "0"]) == 2
    assert capsys.readouterr().err.strip() == ("error: temperature 0.0: give a finite number above 0 (1 is the model's own "
                                               "softmax; the app's slider spans 0.1..10)")


def test_nothing_of_it_imports_gradio():
    code = ("import sys, torch\n"
            "import vit_demo.api, vit_demo.inside, vit_demo.cli.steps, vit_demo.present.inside, vit_demo.viz.steps\n"
            "from vit_demo.model import VisionTransformer, ViTConfig\n"
            "m = VisionTransformer(ViTConfig(img_size=(32, 32), patch_size=8, embed_dim=32, depth=2, num_heads=2, "
            "num_classes=5)).eval()\n"
            "w = vit_demo.inside.step_through(m, torch.randn(3, 32, 32))\n"
            "[w.render(s.name) for s in w.steps]\n"
            "print(sorted(k for k in sys.modules if k.split('.')[0] in ('gradio', 'gradio_client')))\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_a_walk_reads_its_own_forward_while_others_run_the_model():
    """The app shares one model among its users: a forward pass of another thread while the hooks are
    on passes the same modules, and must not be what the walk reads."""
    import threading

    model, x = tiny("plain")
    alone = step_through(model, x, patch=(1, 2), layer=1, head=1).values
    other, stop = torch.randn(4, 3, 32, 48), threading.Event()

    def busy() -> None:
        with torch.no_grad():
            while not stop.is_set():
                model(other, capture=True)

    worker = threading.Thread(target=busy)
    worker.start()
    try:
        walks = [step_through(model, x, patch=(1, 2), layer=1, head=1).values for _ in range(20)]
    finally:
        stop.set()
        worker.join()
    for v in walks:
        for name in ("pixels", "embedding", "query", "keys", "scores", "attention", "mlp_hidden", "lens"):
            np.testing.assert_array_equal(v[name], alone[name], err_msg=name)


def test_a_model_in_bf16_steps_through():
    """A model set to bfloat16 (the app's --precision auto on such a CPU): the same walk, in float32
    numbers, the attention still the softmax of its scores within bf16's precision."""
    from vit_demo.precision import set_precision

    model, x = tiny("rope-mixed")
    fp32 = step_through(model, x, patch=(2, 3), layer=1, head=0).values
    set_precision(model, "bf16")
    v = step_through(model, x, patch=(2, 3), layer=1, head=0).values
    assert all(np.asarray(a).dtype in (np.float32, np.int64) for a in v.values())
    np.testing.assert_allclose(v["attention"], softmax(v["scores"]), atol=2e-2)
    np.testing.assert_allclose(v["logits"], fp32["logits"], atol=5e-2)
    np.testing.assert_allclose(v["lens"][-1], v["logits"], atol=5e-2)
