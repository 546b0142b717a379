"""The articles' printed numbers, recomputed by kda.tables, within the precision they were printed."""

import math

import pytest

from kda.site.runtime import in_language
from kda.tables import level1 as t1
from kda.tables import level2 as t2


def en(words: str) -> str:
    """A table's cell in English (cells may carry both languages, kda.site.runtime.text)."""
    return in_language(words, "en")


def test_level1_agreement_structure():
    t = t1.agreement()
    errs = dict(zip(map(en, t.column("comparison")), t.column("rel L2")))
    assert all(e < 1e-15 for name, e in errs.items() if "without" not in name)
    assert errs["B without the right shift vs A"] > 0.1          # article: 7.78e-1 on its inputs


def test_level1_seq_in_loop_table():
    t = t1.seq_in_loop_agreement()
    errs = t.column("rel L2 vs A")
    assert all(e < 1e-15 for e in errs[:3])                         # article: 5.60e-16
    assert errs[3] > 0.1                                            # article: 6.98e-1


# article 000 section 6.3, D = 64, BC = 64: N -> (redundancy, step 1, ideal, FA, ratio, ideal ratio)
LEDGER = {512: (3.5, 0.015, 0.017, 0.034, 0.438, 0.500), 2048: (15.5, 0.260, 0.067, 0.537, 0.484, 0.125),
          8192: (63.5, 4.261, 0.268, 8.590, 0.496, 0.031), 16384: (127.5, 17.113, 0.537, 34.360, 0.498, 0.016),
          65536: (511.5, 274.609, 2.147, 549.756, 0.500, 0.004)}


def test_flop_ledger_matches_article():
    for row in t1.flop_ledger().rows:
        N, _, red, grid, ideal, fa, r1, r2 = row
        want = LEDGER[N]
        assert red == want[0]
        for got, printed in zip((grid / 1e9, ideal / 1e9, fa / 1e9, r1, r2), want[1:]):
            assert round(got, 3) == printed


def test_chunk_size_and_out_of_grid_tables():
    assert t1.chunk_size_choice().column("D/(2 BC)") == [1.0, 0.5, 0.25, 0.125]
    t = t1.sequence_out_of_grid()
    # article section 6.4.2: the in-loop column is the state updates alone, 0.067 ... 0.537 GFLOP
    assert [round(x / 1e9, 3) for x in t.column("seq-in-loop state updates, GFLOP")] == [0.067, 0.134, 0.268, 0.537]
    assert t.column("ratio") == [63.5, 127.5, 255.5, 511.5]
    assert t1.fused_or_split().column("MiB") == [512, 512]           # article: h is 512 MiB


def test_level2_agreement_and_degeneration():
    errs = t2.agreement().column("rel L2")
    assert all(e < 1e-15 for e in errs)                              # article: 1.6e-16 .. 2.0e-16
    assert float(t2.per_token().rows[0][1]) < 1e-15                  # article: 2.03e-16


# article 002 section 3: alpha -> (a^-31, a^-63, a^-127, fp16 bound, fp32 bound)
OVERFLOW = {0.99: (1.37, 1.88, 3.58, 1103, 8827), 0.95: (4.90, 25.3, 675, 216, 1729),
            0.90: (26.2, 763, 6.47e5, 105, 842), 0.80: (1.01e3, 1.27e6, 2.03e12, 49, 397),
            0.50: (2.15e9, 9.22e18, 1.70e38, 15, 127)}


def test_overflow_table_matches_article():
    for a, p31, p63, p127, n16, n32 in t2.overflow().rows:
        want = OVERFLOW[round(a, 2)]
        for got, printed in zip((p31, p63, p127), want[:3]):
            assert math.isclose(got, printed, rel_tol=5e-3)          # printed to 3 digits
        assert (n16, n32) == want[3:]


def test_fp16_single_chunk_nan_cells():
    t = t2.fp16_single_chunk(trials=5)
    for a, ratio, factor, _ in t.rows:
        assert 3e-4 < ratio < 6e-4                                    # article: 4.1e-4 .. 4.6e-4
        if a <= 0.8:
            assert math.isnan(factor)                                 # article: NaN
        else:
            assert 3e-4 < factor < 6e-4


def test_gamma_range_and_underflow():
    t = t2.gamma_range()
    assert t.column("max") == [1.0, 1.0, 1.0] and t.column("share underflowed to 0") == [0.0, 0.0, 0.0]
    for got, printed in zip(t.column("smallest nonzero"), (2.79e-1, 1.55e-6, 5.88e-39)):
        assert math.isclose(got, printed, rel_tol=1e-2)
    # the article calls 5.88e-39 a normal fp32 number; it is below fp32's smallest normal
    assert en(t.column("fp32 class of the smallest")[2]) == "subnormal"
    classes = {row[0]: (en(row[2]), en(row[4])) for row in t2.fp16_underflow().rows}
    assert classes[0.9] == ("normal", "subnormal") and classes[0.8] == ("subnormal", "underflows to 0")
    assert classes[0.5] == ("underflows to 0", "underflows to 0")


@pytest.mark.parametrize("alpha,printed", [(0.999, 6904), (0.99, 687), (0.95, 135), (0.9, 66), (0.5, 10)])
def test_memory_length(alpha, printed):
    rows = {row[0]: row[2] for row in t2.memory_length().rows}
    assert round(rows[alpha]) == printed


def test_worked_examples_of_article_002():
    """Section 2.2: alpha = 0.5, C = 4 gives gamma = (0.5, 0.25, 0.125, 0.0625) and Gamma[4, 1] = 0.125;
    for alpha = 0.9 the full D has 1.111, 1.235, 1.372 above the diagonal."""
    import torch

    from kda.reference.level2 import decay_weights

    gamma = torch.cumprod(torch.full((4,), 0.5, dtype=torch.float64), 0)
    assert gamma.tolist() == [0.5, 0.25, 0.125, 0.0625]
    Gamma, *_ = decay_weights(torch.tensor([0.5], dtype=torch.float64), 4, torch.tensor([4]))
    assert Gamma[0, 3, 0].item() == 0.125 and Gamma[0, 0, 3].item() == 0.0
    g9 = torch.cumprod(torch.full((4,), 0.9, dtype=torch.float64), 0)
    D = g9[:, None] / g9[None, :]
    assert [round(D[0, j].item(), 3) for j in (1, 2, 3)] == [1.111, 1.235, 1.372]


def test_level3_factorization_limits():
    """The factorized intra scores fail where e^((C-1)|g|) leaves the operand's range: fp32 and bf16
    together, fp16 far earlier, and halving C roughly doubles the gate it survives."""
    from kda.tables import level3 as t3

    table = t3.factorization_limits()
    limit = {(row[0], row[1]): row[2] for row in table.rows}
    assert limit[(64, "fp32")] == pytest.approx(-1.366, abs=0.01)           # the math chapter's bound
    assert limit[(64, "bf16")] == pytest.approx(limit[(64, "fp32")], abs=0.01)
    assert -0.2 < limit[(64, "fp16")] < -0.1
    for dtype in ("fp32", "fp16"):
        assert limit[(32, dtype)] == pytest.approx(2 * limit[(64, dtype)], rel=0.05)
    for row in table.rows:                     # where it fails, the key factor is near the format's top
        top = {"fp32": 3.4e38, "bf16": 3.4e38, "fp16": 65504.0}[row[1]]
        assert top / 1e3 < row[4] * 10 and row[4] < top * 10


def test_level3_strong_gates_and_diagonal_path():
    from kda.tables import level3 as t3

    rows = t3.strong_gates().rows
    assert all(math.isnan(r[1]) and math.isnan(r[2]) for r in rows if r[0] <= -5)
    assert all(r[3] < 1e-12 for r in rows)
    share = {en(r[0]): r[3] for r in t3.diagonal_path_share(96.0, T=1024, H=2).rows}
    assert share["logsigmoid(x) (GLA)"] == 0 and share["uniform in [-20, 0]"] == 1


def test_level4_solve_conditioning():
    """Unit keys keep I + A well conditioned (the inverse's entries stay at most 1); raw keys do not."""
    from kda.tables import level4 as t4

    rows = {en(r[0]): r for r in t4.solve_conditioning(chunks=8).rows}
    assert rows["L2-normalized"][2] < 10 and rows["L2-normalized"][3] <= 1 + 1e-9
    assert rows["L2-normalized"][4] < 1e-6
    assert rows["raw N(0, 1)"][2] > 1e6


def test_level5_capped_steps_error():
    """Capping each token's fall at chunk_intra's step_cap moves KDA's output by far less than bf16's rounding of
    the inputs does, and not at all for gates that never fall that far in one token (logsigmoid, safe_gate's)."""
    from kda.kernels.chunk_intra import SUBCHUNK, step_cap
    from kda.tables import level5 as t5

    rows = {r[0]: r for r in t5.capped_steps_error(step_cap(SUBCHUNK), T=128).rows}
    for form, (_, share, exact, capped, alone) in rows.items():
        assert 1e-3 < exact < 5e-3 and capped <= exact * 1.05 + 1e-5 and alone < exact / 5, form
        assert (share == 0) == (alone < 1e-12), form
    assert rows["logsigmoid"][1] == 0 and rows["safe_gate"][1] == 0 and rows["layer"][1] > 0.1
