"""The pictures of one folder job (the Whole folder tab's survey, the Atlas tab's new atlas) from
an upload of several pictures or zips, within its limits: how many pictures (:func:`picture_limit`),
what the zips may unpack (:func:`allowance`), the upload cap, and the exports' disk budget; in a new
export folder, removed at once if the job fails (:func:`received`); and how each picture is read
(:func:`picture_loader`: the single upload's pixel limit and reduction). Both tabs take their
pictures here, and neither imports the other."""

from __future__ import annotations

import functools
import secrets
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from PIL import Image

from ..images import IMAGE_SUFFIXES, Allowance, ImageError, extract_pictures, load_image, open_checked, safe_parts
from ..progress import check
from .context import Context
from .exports import export_dir
from .server.limits import Limits
from .server.workspace import folder_bytes, trim, workspace
from .session import WORK_PIXELS

MAX_PICTURES = 1000  # per job on this computer
MAX_PICTURES_EXPOSED = 100  # per job when the app is reachable by others
ENTRIES_PER_PICTURE = 20  # members of the uploaded zips looked at, per picture a job may take
READ_BYTES = 1 << 30  # bytes decompressed per job, kept or not (about 3 s of CPU)
BATCH = 8  # pictures a survey runs through the model at once in the app: its time limit is checked between
# batches (and between the probes' masked passes), and a batch of 16 took the amortised LRP's gradient passes 23 s at
# a load of 7 on 2 cores; 8 a batch cost 0.82 times the time of 4 a batch (16 photos, bf16, load 18-23: docs/survey.md)


def allowance(max_files: int) -> Allowance:
    """What one survey's upload may unpack: :data:`ENTRIES_PER_PICTURE` members per picture it may
    keep, :data:`READ_BYTES` decompressed, what the exports' disk budget has room for (the oldest
    exports go first to make room for half of it), within the slow lane's time limit."""
    ws = workspace()
    trim(ws.exports, ws.exports_budget // 2)
    room = max(0, ws.exports_budget - folder_bytes(ws.exports))
    return Allowance(entries=ENTRIES_PER_PICTURE * max_files, read=READ_BYTES, written=room, check=check)


def gather_uploads(files: list[Any], dest: Path, max_files: int, max_bytes: int, allow: Allowance
                   ) -> tuple[Path, list[str]]:
    """Copy the uploaded pictures and the pictures of uploaded zips into ``dest/pictures`` (a zip's
    sub-folders become class folders; loose pictures go to ``unlabelled/`` when there are any),
    every byte charged to ``allow`` before it is written. Returns the folder and notes on what
    was skipped."""
    pics = dest / "pictures"
    pics.mkdir(parents=True)
    notes: list[str] = []
    count = 0
    for f in files or []:
        allow.tick()
        path = Path(f if isinstance(f, str) else getattr(f, "path", None) or f.get("path"))
        if count >= max_files:
            notes.append(f"only the first {max_files} pictures are used")
            break
        if path.suffix.lower() == ".zip":
            written, more = extract_pictures(path, pics, max_files - count, max_bytes, allow)
            count += len(written)
            notes += more
        elif path.suffix.lower() in IMAGE_SUFFIXES:
            try:
                allow.take_written(path.stat().st_size)
            except ValueError as e:
                notes.append(f"skipped {path.name}: {e}")
                continue
            name = (safe_parts(path.name) or ["picture"])[-1]
            shutil.copyfile(path, pics / f"{count:05d}_{name}")
            count += 1
        else:
            notes.append(f"skipped {path.name}: not a picture or a zip")
    if count == 0:
        raise ImageError("no pictures in the upload: choose several image files or a zip of them"
                         + (f" ({notes[-1]})" if notes else ""))
    loose = [p for p in pics.iterdir() if p.is_file()]
    if loose and any(p.is_dir() for p in pics.iterdir()):
        (pics / "unlabelled").mkdir(exist_ok=True)
        for p in loose:
            p.rename(pics / "unlabelled" / p.name)
    return pics, notes


def picture_loader(limits: Limits) -> Callable[[str], Image.Image]:
    """How a folder job reads each of its pictures: as a single upload is read (:func:`vit_demo.app.session.open_image`),
    over ``--max-megapixels`` refused from its header, the upload cap, and reduced at load to
    :data:`~vit_demo.app.session.WORK_PIXELS` (a JPEG decoded at a reduced scale, any other
    reduced before it becomes an array). A survey read them whole: one zip of 64-MP float TIFFs
    raised its memory by 1.75 GB."""
    return functools.partial(load_image, max_pixels=limits.max_pixels, max_bytes=limits.max_upload_bytes,
                             reduce_to=WORK_PIXELS)


def drop_oversized(pics: Path, limits: Limits) -> list[str]:
    """Delete the pictures under ``pics`` that an upload would refuse by its header
    (:func:`vit_demo.images.open_checked`: over ``--max-megapixels`` or the upload cap, or no readable
    header), before anything decodes them whole: a job that reads its pictures itself (training, in a
    child process) gets the upload's limits this way. Returns a note per picture dropped."""
    notes = []
    for path in sorted(p for p in pics.rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES):
        try:
            open_checked(path, limits.max_pixels, limits.max_upload_bytes).close()
        except ImageError as e:
            path.unlink()
            notes.append(f"skipped {path.relative_to(pics)}: {str(e).removeprefix(path.name + ': ')}")
    return notes


def picture_limit(ctx: Context) -> int:
    """Pictures one folder job may take: :data:`MAX_PICTURES`, :data:`MAX_PICTURES_EXPOSED` when exposed."""
    return MAX_PICTURES_EXPOSED if ctx.cfg.exposed else MAX_PICTURES


@contextmanager
def received(ctx: Context, files: list[Any]) -> Iterator[tuple[Path, Path, list[str]]]:
    """The uploaded pictures (and zips) of one folder job, within the survey's limits
    (:func:`picture_limit`, :func:`allowance`, the upload cap), in a new export folder whose name
    no one can guess: ``(folder, its pictures, notes on what was skipped)``. The job runs inside;
    if it fails, its files go at once. The survey and the atlas both take their pictures here."""
    limit = picture_limit(ctx)
    allow = allowance(limit)
    base = export_dir()
    out = base / secrets.token_hex(16)
    try:
        pics, notes = gather_uploads(files, out, limit, ctx.cfg.limits.max_upload_bytes, allow)
        yield out, pics, notes
    except BaseException:
        shutil.rmtree(base, ignore_errors=True)
        raise


def unreadable(e: ValueError, pics: Path, notes: list[str]) -> ImageError:
    """A job's "nothing readable" error, said without the server's folder."""
    why = str(e).replace(f"{pics}/", "").replace(str(pics), "the upload")
    return ImageError(why + (f" ({notes[-1]})" if notes else ""))
