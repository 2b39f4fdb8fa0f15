"""The int4_moe op's `expected_slots` hint: the contract between the reference
(reference/int4_moe.py) and its kernels (kernels/int4_moe/), so a kernel checks it without
importing reference code (as workbench/tree.py does for the DDTree record).

expected_slots: how many of the T K slots the caller expects to name an expert here (EP on a
replicated stream: about T K / ep, the rest -1). Kernels may size tiles for it; results never
depend on it. Legend: T tokens, K slots a token.
"""

from __future__ import annotations


def check_expected_slots(expected_slots, T: int, K: int) -> None:
    """The op's hint: None, or an int in [0, T K]; a ValueError naming it otherwise."""
    ok = expected_slots is None or (isinstance(expected_slots, int)
                                    and not isinstance(expected_slots, bool)
                                    and 0 <= expected_slots <= T * K)
    if not ok:
        raise ValueError(f"expected_slots: expected None or an int in [0, T*K = {T * K}], "
                         f"got {expected_slots!r}")
