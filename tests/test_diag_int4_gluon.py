"""scripts/diag_int4_gluon.py's comparison: bitwise equality through the bf16 bits, the largest
|difference|, NaN counts and the differing rows (its GPU cases need the H200)."""

import importlib.util
import pathlib

import torch

_PATH = pathlib.Path(__file__).resolve().parents[1] / "scripts" / "diag_int4_gluon.py"


def _diag():
    spec = importlib.util.spec_from_file_location("diag_int4_gluon", _PATH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_compare_names_the_rows_that_differ():
    d = _diag()
    a = torch.randn(4, 6).bfloat16()
    assert d.compare(a, a.clone()) == {"bitwise": True, "max_abs": 0.0, "nan_a": 0, "nan_b": 0,
                                       "rows": [], "n_rows": 0}
    b = a.clone()
    b[2, 1] += 1.0
    b[3, 0] = float("nan")
    c = d.compare(b, a)
    assert not c["bitwise"] and c["rows"] == [2, 3] and c["n_rows"] == 2
    assert c["nan_a"] == 1 and c["nan_b"] == 0 and c["max_abs"] == float("inf")
    z = torch.zeros(2, 3).bfloat16()
    assert not d.compare(z, -z)["bitwise"]  # -0 and +0: other bits, |d| 0
