"""The sweep plot (issue 10, item 12): the format follows the suffix, the x axis reads 32k…, the
memory axes are linear near the HBM line, the legend sits off the data and lists only drawn lines."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")

ROOT = Path(__file__).resolve().parents[2]
MAGIC = {"png": b"\x89PNG", "pdf": b"%PDF", "svg": b"<?xml"}


def _sweep(out: Path, lens: str = "32k,64k") -> subprocess.CompletedProcess:
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "MPLBACKEND": "Agg", "HOME": str(out.parent)}
    return subprocess.run([sys.executable, "-m", "planner.cli", "sweep", "olmoe-1b-7b", "--gpus", "4", "--seq-lens",
                           lens, "--plot", str(out), "--no-progress"], capture_output=True, text=True, env=env,
                          timeout=300)


@pytest.mark.parametrize("fmt", ["png", "pdf", "svg"])
def test_plot_format_follows_suffix(tmp_path, fmt):
    out = tmp_path / f"sweep.{fmt}"
    res = _sweep(out)
    assert res.returncode == 0, res.stderr
    assert out.read_bytes()[:5].startswith(MAGIC[fmt])


def test_unknown_suffix_is_refused_before_the_sweep(tmp_path):
    res = _sweep(tmp_path / "sweep.jpg2")
    assert res.returncode == 2 and "--plot" in res.stderr and ".svg" in res.stderr
    assert not (tmp_path / "sweep.jpg2").exists()


def test_axes_legend_and_panels(tmp_path, monkeypatch):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from planner import api
    from planner.report import sweep_view

    rows = api.sweep(model="olmoe-1b-7b", gpus=4, seq_lens=[1 << 15, 1 << 16])
    seen = {}
    monkeypatch.setattr(plt, "close", lambda fig: seen.setdefault("fig", fig))
    sweep_view.write_plot(rows, str(tmp_path / "p.svg"), "t")
    fig = seen["fig"]
    mem, _, thr = fig.axes
    assert [t.get_text() for t in mem.get_xticklabels()] == ["32k", "64k"]
    assert mem.get_yscale() == "linear"
    cap = rows[0].capacity_bytes / 2**30
    assert mem.get_ylim() == pytest.approx((0, sweep_view.Y_HEADROOM * cap))
    assert not mem.get_legend() and not thr.get_legend() and len(fig.legends) == 1
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    drawn = {ln.get_label() for ax in fig.axes for ln in ax.get_lines()}
    assert all(lb in drawn for lb in labels), "every legend entry is a drawn line"
    assert "optimizer_step" not in labels or any(
        r.live_set_max_bytes["optimizer_step"] > 0 for r in rows)
    texts = {t.get_text() for t in thr.texts}
    assert sweep_view.short_plan(rows[0].plan) in texts, "the throughput panel names each point's plan"
