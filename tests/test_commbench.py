"""workbench/dist/commbench.py: measured collectives and the Link fitted to them (2 gloo ranks
here; NCCL on the GPU machines)."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from workbench.dist import commbench
from workbench.dist.emulate import Link

RUN = {"timeout_s": 120, "collective_timeout_s": 60}


def test_fit_recovers_a_known_link_from_its_own_prices():
    truth = Link("truth", bw_gbps=123.0, alpha_us=17.0, efficiency=1.0)
    rows = [{"kind": k, "nbytes": n, "world": w, "seconds": truth.seconds(k, n, w)}
            for k in commbench.KINDS for n in (1024, 2**20, 2**26) for w in (2, 8)]
    fit = commbench.fit_link(rows, "fit")
    assert fit.bw_gbps == pytest.approx(123.0, rel=1e-9)
    assert fit.alpha_us == pytest.approx(17.0, rel=1e-9)
    for r in commbench.compare(rows, (fit,)):
        assert r["fit_ratio"] == pytest.approx(1.0, rel=1e-9)


def test_fit_rejects_what_cannot_define_a_line():
    with pytest.raises(ValueError, match="rows: expected"):
        commbench.fit_link([])
    one = {"kind": "all_reduce", "nbytes": 1024, "world": 2, "seconds": 1e-5}
    with pytest.raises(ValueError, match="different sizes"):
        commbench.fit_link([one, dict(one)])
    with pytest.raises(ValueError, match="kind: expected one of"):
        commbench._op("broadcast", 1024, 2, "cpu")


def test_gloo_ranks_time_every_kind_and_size(tmp_path):
    from workbench.dist.launch import run_distributed

    sizes = (1024, 65536)
    rows = run_distributed(commbench.bench_rank, 2, commbench.KINDS, sizes, 3, 1, **RUN)
    assert [(r["kind"], r["nbytes"]) for r in rows] == \
        [(k, n) for k in commbench.KINDS for n in sizes]
    assert all(r["world"] == 2 and r["backend"] == "gloo" and r["seconds"] > 0
               and r["stream_seconds"] > 0 for r in rows)
    path = tmp_path / "cb.csv"
    pd.DataFrame(rows).to_csv(path, index=False)
    link = commbench.read_link(str(path))
    assert link.bw_gbps > 0 and link.alpha_us >= 0 and math.isfinite(link.bw_gbps)


def test_cli_writes_the_rows_with_model_and_fit(tmp_path, capsys):
    path = tmp_path / "cb.csv"
    assert commbench.main(["--sizes", "1024,16384", "--iters", "2", "--kinds",
                           "all_reduce,all_to_all", "--csv", str(path)]) == 0
    out = capsys.readouterr().out
    assert "fitted (all kinds)" in out and "all_to_all: back to back alpha" in out
    df = pd.read_csv(path)
    assert len(df) == 4 and {"measured_us", "alone_us", "stream_seconds", "NVLink4_us", "fit_w2_us",
                             "git_sha"} <= set(df)
    with pytest.raises(SystemExit, match="--kinds: expected a subset"):
        commbench.main(["--kinds", "all_reduce,scatter"])


def test_emulator_prices_a_measured_link_next_to_the_models(tmp_path):
    from workbench.dist import emulate

    truth = Link("truth", bw_gbps=50.0, alpha_us=30.0, efficiency=1.0)
    path = tmp_path / "cb.csv"
    pd.DataFrame([{"kind": k, "nbytes": n, "world": 2, "seconds": truth.seconds(k, n, 2)}
                  for k in commbench.KINDS for n in (1024, 2**22)]).to_csv(path, index=False)
    table = tmp_path / "emu.csv"
    emulate.main(["--preset", "tiny-dist", "--layouts", "ep8", "--batches", "1", "--budgets",
                  "ar", "--repeats", "1", "--device", "cpu", "--measured-link", str(path),
                  "--csv", str(table)])
    df = pd.read_csv(table)
    assert list(df["link"]) == ["NVLink4", "PCIe5x16", "measured"]
    slow = df.set_index("link")["comm_ms"]
    assert slow["measured"] > slow["NVLink4"]  # 30 us a collective against the model's 10
