"""scripts/diag_int4_gluon.py's comparison: bitwise equality through the bf16 bits, the largest
|difference|, NaN counts and the differing rows (its GPU cases need the H200)."""

import torch
from script_module import load


def _diag():
    return load("diag_int4_gluon")


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
