"""The slide deck (vit_demo.present.deck): structure of the PowerPoint file (slides, pictures, notes,
sections), the numbers it quotes, and the PDF rendered page by page with pdftoppm.

One two-image deck is built once per module (figures at 900 px, one random order for the
faithfulness baseline, to keep it quick) and shared by the tests; it is written once as
PowerPoint and once as PDF. The command runs on one image at 600 px.
"""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
from PIL import Image
from skimage import data

from vit_demo.cli.main import main
from vit_demo.present import deck
from vit_demo.present import slides as slides_io

SEEDS = (0,)  # random orders of the faithfulness baseline (the library's default is three)
PAPER = re.compile("|".join(re.escape(v.split(",")[0]) for v in deck.PAPERS.values()))


@pytest.fixture(scope="module")
def photos() -> list[Image.Image]:
    return [Image.fromarray(data.chelsea()), Image.fromarray(data.coffee())]


@pytest.fixture(scope="module")
def slides(deit_tiny, photos):
    return deck.build_slides(deit_tiny, photos, ["cat", "coffee"], width_px=900, seeds=SEEDS)


def test_talk_order_titles_pictures_and_notes(slides):
    assert len(slides) == deck.slide_count(2) == 15
    titles = [s.title for s in slides]
    assert titles[0] == "What the model sees: cat" and titles[6] == "What the model sees: coffee"
    assert titles[1:5] == ["From pixels to tokens", "The 3 heads of the last layer", "Attention across the layers",
                           "Attention rollout"]
    assert titles[5].endswith("Class-specific relevance")
    assert titles[-3:] == ["The images side by side", "Checked against timm: identical", "The model"]
    for s in slides:
        assert s.title and s.pictures and all(p.width >= 400 for p in s.pictures)
        sentences = [t for t in re.split(r"(?<=[.!?])\s+(?=[A-Z(])", s.notes) if t.strip()]
        assert 2 <= len(sentences) <= 4, (s.title, sentences)
        assert PAPER.search(s.notes), s.title


def test_quoted_numbers_are_the_computed_ones(deit_tiny, slides, photos, tmp_path):
    from vit_demo import methods
    from vit_demo.evaluate.faithfulness import evaluate

    rel = slides[5]
    scores, target = rel.meta["faithfulness"], rel.meta["target"]
    assert set(scores) == {"attention", "rollout", *methods.names(slow=False, class_specific=True),
                           "random"}  # every map the app's relevance tab has (analysis.class_maps)
    assert f"{scores['chefer']['deletion_auc']:.3f}" in rel.notes and f"{scores['chefer']['insertion_auc']:.3f}" in rel.notes
    # the same protocol as the faithfulness command, on the same picture
    path = tmp_path / "cat.png"
    photos[0].save(path)
    r = evaluate(deit_tiny, [path], ["chefer"], progress=False, random_seeds=SEEDS)
    for name in ("chefer", "random"):  # the random baseline too: the same orders as the command's
        for auc in ("deletion_auc", "insertion_auc"):
            assert r["methods"][name][auc] == pytest.approx(scores[name][auc], abs=1e-6), (name, auc)
    assert slides[0].meta["predictions"][0]["index"] == target  # explains the top-1 class by default
    check = slides[-2]
    assert check.meta["passed"] and check.subtitle.startswith("Identical to")
    assert all(c["max_abs_logit_diff"] < 1e-4 for c in check.meta["checks"])
    assert f"{deit_tiny.model.num_params:,}" in dict(slides[-1].meta["rows"])["parameters"]


def test_faithfulness_scores_default_maps_are_the_single_pass_methods(deit_tiny, slides, photos):
    """With no maps given, the scores cover methods.single_pass() (never the slow RISE or causal
    LRP, hundreds of forward passes each) and agree with the deck's own, which passed its maps."""
    from vit_demo import methods
    from vit_demo.preprocess import preprocess

    rel = slides[5]  # the first photo's relevance slide
    x, target = preprocess(photos[0], deit_tiny.data_config)[0][None], rel.meta["target"]
    scores = deck.faithfulness_scores(deit_tiny.model, x, target, seeds=SEEDS)
    assert list(scores) == [*methods.single_pass(), "random"]
    for name in ("chefer", "lrp-gated", "random"):
        assert scores[name]["deletion_auc"] == pytest.approx(rel.meta["faithfulness"][name]["deletion_auc"], abs=1e-6)


def test_pptx_opens_with_sections_pictures_and_notes(slides, tmp_path):
    from pptx import Presentation
    from pptx.enum.shapes import MSO_SHAPE_TYPE

    path = slides_io.write_pptx(slides, tmp_path / "talk.pptx")
    prs = Presentation(str(path))
    assert prs.slide_width * 9 == prs.slide_height * 16
    assert len(prs.slides) == len(slides)
    for s, sl in zip(slides, prs.slides):
        assert sl.shapes.title.text == s.title
        pics = [sh for sh in sl.shapes if sh.shape_type == MSO_SHAPE_TYPE.PICTURE]
        assert len(pics) == len(s.pictures)
        for sh, img in zip(pics, s.pictures):
            assert sh.image.size == img.size  # the full-resolution render, not a thumbnail
            assert 0 <= sh.left and sh.left + sh.width <= prs.slide_width
            assert 0 <= sh.top and sh.top + sh.height <= prs.slide_height
        assert sl.notes_slide.notes_text_frame.text == s.notes
    assert slides_io.pptx_sections(path) == [("Image: cat", 6), ("Image: coffee", 6), ("Comparison", 1), ("The model", 2)]


def test_pdf_pages_render(slides, tmp_path):
    path = slides_io.write_pdf(slides, tmp_path / "talk.pdf")
    if shutil.which("pdftoppm") is None:
        pytest.skip("needs pdftoppm (Debian poppler-utils; .ci/pdf-deps installs it in CI)")
    subprocess.run(["pdftoppm", "-r", "30", "-png", str(path), str(tmp_path / "page")], check=True)
    pages = sorted(tmp_path.glob("page-*.png"))
    assert len(pages) == len(slides)
    for page in pages:
        im = Image.open(page).convert("L")
        assert abs(im.width / im.height - 16 / 9) < 0.02
        lo, hi = im.getextrema()
        assert hi - lo > 100  # a title and a picture on white, not a blank page


def test_deck_command(deit_tiny_path, tmp_path, capsys):
    img = tmp_path / "n02123045_tabby.png"
    Image.fromarray(data.chelsea()).save(img)
    out = tmp_path / "talk.pptx"
    assert main(["deck", str(img), "--weights", str(deit_tiny_path), "--out", str(out), "--width", "600",
                 "--random-orders", "1"]) == 0
    assert f"wrote {out} ({deck.slide_count(1)} slides)" in capsys.readouterr().out
    from pptx import Presentation

    prs = Presentation(str(out))
    assert len(prs.slides) == 8 and prs.slides[0].shapes.title.text == "What the model sees: tabby"
    assert main(["deck", str(img), "--weights", str(deit_tiny_path), "--out", str(out), "--class", "no such class"]) == 2
    assert "no class has that label" in capsys.readouterr().err
    assert main(["deck", str(img), "--weights", str(deit_tiny_path), "--out", str(out), "--random-orders", "0"]) == 2
    assert "at least 1 order" in capsys.readouterr().err
