"""Training precision (issue 43): ``--precision auto`` trains in bf16 only where the hardware
multiplies bf16 (the detector read once, in vit_demo/precision.py), ``fp32`` forces fp32,
``--amp`` is ``bf16``; a run on a busy CPU may keep fewer torch threads. The detector is checked
against this machine's CPU flags, and patched to stand for other machines; the training runs are
real (a few seconds each), and what they ran in is read off the linear layers' outputs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import vit_demo.train.budget as budget
import vit_demo.train.fast as fast
from vit_demo.precision import bf16_is_fast
from vit_demo.train.data import EASY, DataError, make_shapes
from vit_demo.train.fast import step_context, use_bf16
from vit_demo.train.loop import TrainOptions, run

CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def one_thread():
    """One torch thread, as the other training tests run (OMP_NUM_THREADS=1): on a shared 2-core
    machine two are many times slower."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def cpu_flags() -> set[str]:
    """The CPU's feature flags as Linux lists them (/proc/cpuinfo)."""
    info = Path("/proc/cpuinfo")
    if not info.is_file():
        pytest.skip("no /proc/cpuinfo: the CPU's flags are read from it")
    return {f for line in info.read_text().splitlines() if line.startswith("flags") for f in line.split(":", 1)[1].split()}


def test_bf16_only_where_the_cpu_has_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """The detector against this machine's own flags (the EPYC of the 2-core machine has avx512_bf16,
    a CI runner may not); then ``auto`` as the detector says, and fp32 / bf16 forced either way."""
    monkeypatch.delenv("VIT_DEMO_NO_BF16", raising=False)  # a switch that turns the detection off everywhere
    assert bf16_is_fast("cpu") is bool({"avx512_bf16", "amx_tile"} & cpu_flags())
    for detected in (True, False):
        monkeypatch.setattr(fast, "bf16_is_fast", lambda device, d=detected: d)
        assert use_bf16("auto", CPU) is detected
        assert use_bf16("fp32", CPU) is False and use_bf16("bf16", CPU) is True
        assert use_bf16("auto", CPU, scratch=False) is False  # fine-tuning stays fp32 unless asked


def test_no_bf16_on_other_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    assert bf16_is_fast("meta") is False and use_bf16("auto", torch.device("meta")) is False
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert bf16_is_fast("cuda") is False
    with pytest.raises(ValueError, match="--precision must be one of auto, fp32, bf16"):
        use_bf16("fp16", CPU)


def test_the_step_context_computes_in_what_it_says() -> None:
    layer, x = nn.Linear(8, 4), torch.randn(2, 8)
    with step_context(CPU, True):
        assert layer(x).dtype == torch.bfloat16
    with step_context(CPU, False):
        assert layer(x).dtype == torch.float32


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("tiny")
    make_shapes(root, per_class=12, size=32, seed=2, progress=False, style=EASY)
    return root


def dtypes_of_a_run(tiny: Path, out: Path, **flags) -> tuple[set[torch.dtype], list[str]]:
    """The dtypes of every linear layer's output while a 1-epoch run trains, and its log."""
    seen: set[torch.dtype] = set()

    def hook(module: nn.Module, _args, output) -> None:
        if isinstance(module, nn.Linear) and module.training:
            seen.add(output.dtype)
    lines: list[str] = []
    handle = nn.modules.module.register_module_forward_hook(hook)
    try:
        run(TrainOptions(data=str(tiny), out=str(out), epochs=1, batch_size=8, progress=False, **flags), lines.append)
    finally:
        handle.remove()
    return seen, lines


@pytest.mark.parametrize("detected", [True, False])
def test_auto_follows_the_detector_and_fp32_turns_it_off(tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         detected: bool) -> None:
    monkeypatch.setattr(fast, "bf16_is_fast", lambda device: detected)
    seen, log = dtypes_of_a_run(tiny, tmp_path / "auto.safetensors")
    assert seen == ({torch.bfloat16} if detected else {torch.float32})
    header = next(line for line in log if line.startswith("scratch on"))
    assert ("bf16 autocast (this device multiplies bf16 in hardware; --precision fp32 turns it off)" in header) is detected
    seen, log = dtypes_of_a_run(tiny, tmp_path / "fp32.safetensors", precision="fp32")
    assert seen == {torch.float32} and next(line for line in log if line.startswith("scratch on")).endswith("on cpu, fp32")
    seen, _ = dtypes_of_a_run(tiny, tmp_path / "amp.safetensors", amp=True)  # --amp: bf16, detected or not
    assert seen == {torch.bfloat16}


def test_amp_with_fp32_is_refused(tiny: Path, tmp_path: Path) -> None:
    with pytest.raises(DataError, match="--amp is --precision bf16"):
        run(TrainOptions(data=str(tiny), out=str(tmp_path / "x.safetensors"), epochs=1, amp=True, precision="fp32",
                         progress=False), lambda m: None)


def test_a_busy_cpu_keeps_one_thread_an_idle_one_keeps_all(monkeypatch: pytest.MonkeyPatch) -> None:
    """The choice, with a step's seconds scripted per thread count (the clock is what varies)."""
    calls: list[int] = []
    scripted: dict[int, float] = {}

    def seconds(step) -> float:
        calls.append(torch.get_num_threads())
        return scripted[torch.get_num_threads()]
    monkeypatch.setattr(budget, "timed", seconds)
    for per_thread, kept, timed_on_2 in (({2: 2.8, 1: 0.2}, 1, 1), ({2: 0.1, 1: 0.15}, 2, 3)):  # load 7, and idle
        scripted.update(per_thread)
        torch.set_num_threads(2)
        calls.clear()
        said: list[str] = []
        assert budget.fastest_threads(lambda: None, said.append) == kept == torch.get_num_threads()
        assert calls == [1, 1, 1] + [2] * timed_on_2  # two threads stop after one step twice as slow as one
        assert said == (["training on 1 torch thread, not 2: a step took 0.20 s on 1 and 2.80 s on 2 "
                         "(other work shares the cores)"] if kept == 1 else [])
    torch.set_num_threads(1)
    calls.clear()
    assert budget.fastest_threads(lambda: None, print) == 1 and calls == []
