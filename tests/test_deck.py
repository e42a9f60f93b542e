"""The slide deck (vit_demo.present.deck): structure of the PowerPoint file (slides, pictures, notes,
sections), the numbers it quotes, and the PDF rendered page by page with pdftoppm.

One two-image deck is built once per module (figures at 900 px, one random order for the
faithfulness baseline, to keep it quick; its progress reports recorded) and shared by the tests;
it is written once as PowerPoint and once as PDF. The command runs on one image at 600 px. The PDF
writer is also checked on its own, on a page of its own (the fast tier: building the deck is slow).
"""

from __future__ import annotations

import re
import shutil
import subprocess

import numpy as np
import pytest
import torch
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


REPORTS: list[tuple[float, str]] = []  # what the module's deck reported to vit_demo.progress


@pytest.fixture(scope="module")
def slides(deit_tiny, photos):
    from vit_demo.progress import reporting

    with reporting(lambda share, text: REPORTS.append((share, text))):
        return deck.build_slides(deit_tiny, photos, ["cat", "coffee"], width_px=900, seeds=SEEDS)


def pptx_sections(path) -> list[tuple[str, int]]:
    """(section name, number of slides) of a deck written by :func:`vit_demo.present.slides.write_pptx`."""
    from pptx import Presentation

    p14 = "{http://schemas.microsoft.com/office/powerpoint/2010/main}"
    root = Presentation(str(path)).part._element
    return [(s.get("name"), len(s.findall(f"{p14}sldIdLst/{p14}sldId"))) for s in root.iter(f"{p14}section")]


@pytest.mark.slow  # the deck: the faithfulness protocol
def test_talk_order_titles_pictures_and_notes(slides):
    assert len(slides) == len(deck.slide_costs(2)) == 25
    titles = [s.title for s in slides]
    # titled by what the model answers, not by the file's name (which is in the subtitle and the section)
    assert titles[0].startswith("What the model sees: “") and "cat" in titles[0]
    assert titles[11] == "What the model sees: “espresso”" and slides[11].subtitle.startswith("Image: coffee")
    assert titles[1:5] == ["From pixels to tokens", "The 3 heads of the last layer", "Attention across the layers",
                           "Attention rollout"]
    assert titles[5].startswith("Why “") and titles[6] == "Can we trust the maps? Hide what they point at"
    assert titles[7:11] == ["Step inside: a patch becomes a token", "Step inside: one query meets every key",
                            "Step inside: a weighted sum, added to the stream",
                            "Step inside: the answer forms layer by layer"]
    assert {s.section for s in slides[7:11]} == {"Step inside: cat"} and "layer 12, head 1" in slides[8].subtitle
    assert titles[-3:] == ["The images side by side", "Checked against timm, both in fp32: identical", "The model"]
    assert "layer 12 of 12" in slides[2].subtitle  # layers counted from 1 on the slides
    for s in slides:
        assert s.title and s.pictures and all(p.width >= 400 for p in s.pictures)
        sentences = [t for t in re.split(r"(?<=[.!?])\s+(?=[A-Z(])", s.notes) if t.strip()]
        assert 2 <= len(sentences) <= 4, (s.title, sentences)
        assert PAPER.search(s.notes), s.title


@pytest.mark.slow  # the deck: the faithfulness protocol
def test_quoted_numbers_are_the_computed_ones(deit_tiny, slides, photos, tmp_path):
    from vit_demo.evaluate.faithfulness import evaluate

    rel = slides[6]
    scores, target = rel.meta["faithfulness"], rel.meta["target"]
    assert set(scores) == {*deck.SCORED, "random"}  # the maps the slides show and the classics, nothing slower
    best = rel.meta["best"]
    assert scores[best]["deletion_auc"] == min(v["deletion_auc"] for k, v in scores.items() if k != "random")
    assert f"{scores[best]['deletion_auc']:.3f}" in rel.notes and f"{scores[best]['insertion_auc']:.3f}" in rel.notes
    half = (len(scores[best]["deletion_curve"]) - 1) // 2  # the point with half of the patches hidden (7 of 14 rows)
    assert f"{scores[best]['deletion_curve'][half] * 100:.1f}%" in rel.subtitle
    assert f"{scores['random']['deletion_curve'][half] * 100:.1f}%" in rel.subtitle
    # the same protocol as the faithfulness command, on the same picture
    path = tmp_path / "cat.png"
    photos[0].save(path)
    r = evaluate(deit_tiny, [path], ["chefer"], progress=False, random_seeds=SEEDS)
    for name in ("chefer", "random"):  # the random baseline too: the same orders as the command's
        for auc in ("deletion_auc", "insertion_auc"):
            assert r["methods"][name][auc] == pytest.approx(scores[name][auc], abs=1e-6), (name, auc)
    assert slides[0].meta["predictions"][0]["index"] == target  # explains the top-1 class by default
    check = slides[-2]
    assert check.meta["passed"] and check.subtitle.startswith("Identical to 0.0001, both in fp32:")
    assert all(c["max_abs_logit_diff"] < 1e-4 for c in check.meta["checks"])
    assert f"{deit_tiny.model.num_params:,}" in dict(slides[-1].meta["rows"])["parameters"]


@pytest.mark.slow  # the faithfulness protocol
def test_faithfulness_scores_default_maps_are_the_single_pass_methods(deit_tiny, slides, photos):
    """With no maps given, the scores cover methods.single_pass() (never the slow RISE or causal
    LRP, hundreds of forward passes each) and agree with the deck's own, which passed its maps."""
    from vit_demo import methods
    from vit_demo.preprocess import preprocess

    rel = slides[6]  # the first photo's faithfulness slide
    x, target = preprocess(photos[0], deit_tiny.data_config)[0][None], rel.meta["target"]
    scores = deck.faithfulness_scores(deit_tiny.model, x, target, seeds=SEEDS)
    assert list(scores) == [*methods.single_pass(), "random"]
    for name in ("chefer", "lrp-gated", "random"):
        assert scores[name]["deletion_auc"] == pytest.approx(rel.meta["faithfulness"][name]["deletion_auc"], abs=1e-6)


@pytest.mark.slow  # the deck: the faithfulness protocol
def test_step_inside_quotes_the_walk(deit_tiny, slides, photos):
    """The "Step inside" slides quote the step-through of the same photo (vit_demo.inside): its
    patch, layer and head, the most weighted token and the logit lens's answer."""
    from vit_demo.api.model import Model

    walk = Model(deit_tiny).steps(photos[0], layer=-1)
    v, f = walk.values, walk.walk.facts
    assert f"{f.patch_name}, layer 12, head 1" in slides[7].subtitle and f.patch_name in slides[7].notes
    best = int(v["attention"].argmax())
    assert f"{f.token_name(best)} gets the most, {v['attention'][best] * 100:.1f}%" in slides[8].notes
    assert f"{v['residual_norms'][-1]:.2f} after layer 12" in slides[9].notes
    assert f"{v['probabilities'].max() * 100:.1f}% for 'Egyptian cat'" in slides[10].notes


@pytest.mark.slow  # the deck: the faithfulness protocol
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
    assert pptx_sections(path) == [("Image: cat", 7), ("Step inside: cat", 4), ("Image: coffee", 7),
                                             ("Step inside: coffee", 4), ("Comparison", 1), ("The model", 2)]


@pytest.mark.slow  # the deck: the faithfulness protocol
def test_progress_names_every_slide_in_order(slides):
    """The deck reports "slide k of n" for every slide, in order, the share only growing, and the
    forward passes of the faithfulness slide inside its own part of the bar."""
    n = len(deck.slide_costs(2))
    shares = [s for s, _ in REPORTS]
    assert shares == sorted(shares) and shares[0] == 0.0 and shares[-1] < 1.0
    firsts = [text for _, text in REPORTS if " · " not in text]
    assert firsts == [f"slide {k} of {n}" for k in range(1, n + 1)]
    inner = [(s, t) for s, t in REPORTS if t.startswith(f"slide 7 of {n} · masked forward passes")]
    passes = (len(deck.SCORED) + len(SEEDS)) * 2 * 13 + 2  # every order's 13 inner points, two curves, + both ends
    assert inner and inner[-1][1].endswith(f"{passes}/{passes}")
    lo, hi = deck.SlideProgress(2).bounds[6:8]
    assert all(lo <= s <= hi + 1e-9 for s, _ in inner)


@pytest.mark.slow  # the deck: the faithfulness protocol
def test_no_folder_of_this_computer_in_any_output(slides, deit_tiny_path):
    """The deck names the weights by their file name: no folder in a title, a subtitle, a note
    or a table (issue 23: the model slide printed the weights' full path)."""
    folder = str(deit_tiny_path.parent)
    for s in slides:
        for text in (s.title, s.subtitle, s.notes, repr(s.meta.get("rows", ""))):
            assert folder not in text, (s.title, text)
    assert dict(slides[-1].meta["rows"])["weights"] == f"the file {deit_tiny_path.name}"
    assert deit_tiny_path.name in slides[-1].notes


@pytest.mark.slow  # the deck: the faithfulness protocol
def test_comparison_scale_is_per_image_unless_shared(slides, deit_tiny, photos):
    comp = slides[-3]
    assert "each map scaled to its own range" in comp.subtitle and "own scale" in comp.notes
    panels = [deck.Panel(p, np.random.default_rng(i).random((14, 14)), [], "m") for i, p in enumerate(photos)]
    shared = deck.comparison_slide(panels, ["cat", "coffee"], 600, "inferno", shared_scale=True)
    assert "one colour scale for all" in shared.subtitle


@pytest.mark.slow  # the deck: the faithfulness protocol
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
    # the text is real text (Helvetica, WinAnsi), in slide order, the typographic quotes intact
    text = subprocess.run(["pdftotext", "-layout", str(path), "-"], check=True, capture_output=True, text=True).stdout
    pos = 0
    for s in slides:
        pos = text.index(s.title, pos)  # raises if a title is missing or out of order
    assert "What the model sees: “espresso”" in text and f"{len(slides)} / {len(slides)}" in text


@pytest.mark.slow  # the deck: the faithfulness protocol
def test_deck_command(deit_tiny_path, tmp_path, capsys):
    img = tmp_path / "n02123045_tabby.png"
    Image.fromarray(data.chelsea()).save(img)
    out = tmp_path / "talk.pptx"
    assert main(["deck", str(img), "--weights", str(deit_tiny_path), "--out", str(out), "--width", "600",
                 "--random-orders", "1", "--format", "both"]) == 0
    printed = capsys.readouterr()
    assert f"wrote {out} ({len(deck.slide_costs(1))} slides)" in printed.out  # PowerPoint and PDF from one run
    assert f"wrote {out.with_suffix('.pdf')} ({len(deck.slide_costs(1))} slides)" in printed.out
    assert "slide 13 of 13" in printed.err  # the progress bar names the slides
    assert "checked against timm: Identical to 0.0001, both in fp32: max logit difference" in printed.out
    assert out.with_suffix(".pdf").read_bytes()[:5] == b"%PDF-"
    from pptx import Presentation

    prs = Presentation(str(out))
    assert len(prs.slides) == 13 and prs.slides[0].shapes.title.text.startswith("What the model sees: “")
    assert "Image: tabby" in prs.slides[0].shapes[1].text_frame.text  # the file's name, as a speaker says it
    assert main(["deck", str(img), "--weights", str(deit_tiny_path), "--out", str(out), "--class", "no such class"]) == 2
    assert "no class has that label" in capsys.readouterr().err
    assert main(["deck", str(img), "--weights", str(deit_tiny_path), "--out", str(out), "--random-orders", "0"]) == 2
    assert "at least 1 order" in capsys.readouterr().err


def test_pdf_writer_places_text_and_pictures(tmp_path):
    """vit_demo.present.pdf on its own: Helvetica's widths (its AFM metrics), lines wrapped to a width,
    and a two-page file whose cross-reference table points at every object; rendered (pdftoppm),
    the picture's two colours are where it was placed and the text is drawn."""
    from vit_demo.present import pdf

    assert pdf.text_width("A", 10) == 6.67 and pdf.text_width("A", 10, "bold") == 7.22  # Helvetica: 667, bold 722
    assert pdf.text_width("W a", 1000) == 944 + 278 + 556 and pdf.text_width("“×”", 100) == pytest.approx(33.3 + 58.4 + 33.3)
    words = "the quick brown fox jumps over the lazy dog while the slides wait for it".split()
    lines = pdf.wrap(" ".join(words), 12, 90)
    assert " ".join(lines).split() == words and len(lines) > 2
    for line, after in zip(lines, lines[1:]):  # each line as long as fits: its next word would not
        assert pdf.text_width(line, 12) <= 90 < pdf.text_width(f"{line} {after.split()[0]}", 12)
    pic = Image.new("RGB", (40, 20), (255, 0, 0))
    pic.paste((0, 0, 255), (20, 0, 40, 20))  # red | blue
    pages = [pdf.Page([pdf.Text("“Tabby” × 3 – café", 20, 10, 24, weight="bold")], [pdf.PlacedImage(pic, (100, 100, 200, 100))]),
             pdf.Page([pdf.Text("The model", 380, 10, 12, align="right")])]
    data = pdf.write(pages, tmp_path / "talk.pdf", (400, 300), title="Talk ×").read_bytes()
    assert data.startswith(b"%PDF-1.4") and b"/Count 2" in data and data.endswith(b"%%EOF\n")
    xref = int(data.rsplit(b"startxref\n", 1)[1].split()[0])
    table = data[xref:].split(b"\n")
    count = int(table[1].split()[1])
    for k in range(1, count):
        offset = int(table[2 + k][:10])
        assert data[offset:].startswith(f"{k} 0 obj".encode()), k
    if shutil.which("pdftoppm") is None:
        pytest.skip("needs pdftoppm to render the pages (Debian poppler-utils; .ci/pdf-deps installs it in CI)")
    subprocess.run(["pdftoppm", "-r", "72", "-png", str(tmp_path / "talk.pdf"), str(tmp_path / "page")], check=True)
    first = np.asarray(Image.open(tmp_path / "page-1.png").convert("RGB")).astype(int)
    assert first.shape == (300, 400, 3)
    assert (np.abs(first[150, 150] - (255, 0, 0)).max() < 40) and (np.abs(first[150, 250] - (0, 0, 255)).max() < 40)
    assert first[10:40, 20:200].min() < 100  # the title's dark text
    second = np.asarray(Image.open(tmp_path / "page-2.png").convert("L")).astype(int)
    assert second[10:25, 300:380].min() < 100 and second[10:25, 0:290].min() > 200  # right-aligned at 380 pt


def test_layers_sentence_reads_its_maps():
    """The layers slide's sentence is read off its maps: a model whose late layers spread their
    attention evenly is not told that they concentrate (a trained model can look so)."""
    flat, peaked = torch.ones(14, 14), torch.zeros(14, 14)
    peaked[3, 4], peaked[9, 9] = 1.0, 0.5
    assert deck.top_share(flat) == pytest.approx(20 / 196, abs=1e-6)
    assert deck.top_share(peaked) == pytest.approx(1.0)
    assert "later layers concentrate" in deck.spread_sentence([flat, flat, peaked])
    assert "first layers are the more concentrated" in deck.spread_sentence([peaked, flat])
    said = deck.spread_sentence([flat, flat])
    assert "alike" in said and "concentrate on" not in said and "10% of the attention in layer 1" in said
