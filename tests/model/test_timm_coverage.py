"""benchmarks/timm_coverage.py's parity part cannot die on one sample: C-RADIO at its position
table's own size (128 x 128 patches) needs 192 GiB of attention maps (the full run was killed
there, at its last sample), so a sample is sized before it runs, refused in words above the cap,
and any failing sample becomes a row of the report that says why. Meta device only: nothing runs."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def coverage():
    spec = importlib.util.spec_from_file_location("timm_coverage", ROOT / "benchmarks" / "timm_coverage.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("timm_coverage", module)
    spec.loader.exec_module(module)
    return module


def test_a_sample_too_large_is_a_row_not_a_crash(coverage, monkeypatch: pytest.MonkeyPatch) -> None:
    radio = "naflexvit_base_patch16_radio_v3"
    full = coverage.attention_bytes(radio, {"depth": 4})
    assert full == 2 * 4 * 2 * 12 * (8 + 128 * 128) ** 2 * 4 > 100 * 2**30  # 8 prefix tokens + 128 x 128 patches
    sampled = next(kw for name, kw, _ in coverage.SAMPLE if name == radio)
    assert coverage.attention_bytes(radio, sampled) < coverage.PARITY_MEMORY  # the table's sample fits
    monkeypatch.setattr(coverage, "SAMPLE", [(radio, {"depth": 4}, "C-RADIOv3 at 2048 px")])
    rows = coverage.parity()
    assert rows[0]["runs"] == [] and "would take 192 GiB" in rows[0]["error"]
    text = coverage.report([{"module": "naflexvit", "name": radio, "tags": [f"{radio}.c_radio"], "refused": None}], rows, 1.0)
    assert "**not run**: ValueError: its attention maps alone would take 192 GiB" in text
    assert "0 of 0 comparisons pass; 1 sample could not run" in text
