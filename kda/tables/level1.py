"""Tables of the level-1 chapter (article 000), computed from the references and the ledger."""

from __future__ import annotations

import torch

from kda import ledger
from kda.metrics import max_abs, rel_l2
from kda.reference import level1 as ref
from kda.site.runtime import text
from kda.tables import Table, sci


def _inputs(B, T, H, DK, DV, seed):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, T, H, DK, generator=g, dtype=torch.float64),
            torch.randn(B, T, H, DK, generator=g, dtype=torch.float64),
            torch.randn(B, T, H, DV, generator=g, dtype=torch.float64))


# --8<-- [start:agreement]
def agreement(seed: int = 0, B=2, T=12, H=2, D=4, chunk_size=4) -> Table:
    """Section 3.4: the chunked (B) and kernel-mirror (C) references against the recurrence (A),
    and B without the right shift, all in float64."""
    q, k, v = _inputs(B, T, H, D, D, seed)
    a = ref.recurrent(q, k, v)[0]
    b = ref.chunked(q, k, v, chunk_size)[0]
    c = ref.seq_in_grid(q, k, v, chunk_size)[0]
    b_no_shift = ref.chunked(q, k, v, chunk_size, shift=False)[0]
    table = Table([text(zh="对照", en="comparison"), text(zh="最大绝对误差", en="max abs"), "rel L2"],
                  formats=[None, sci, sci])
    for name, out, against in [(text(zh="B 分块 vs A 递推", en="B chunked vs A recurrent"), b, a),
                               (text(zh="C 序列在 grid 里 vs A 递推", en="C seq-in-grid vs A recurrent"), c, a),
                               ("C vs B", c, b),
                               (text(zh="B 不右移 vs A", en="B without the right shift vs A"), b_no_shift, a)]:
        table.rows.append([name, max_abs(out, against), rel_l2(out, against)])
    return table
# --8<-- [end:agreement]


# --8<-- [start:seq_in_loop_agreement]
def seq_in_loop_agreement(seed: int = 0, B=2, T=256, H=3, DK=64, DV=128, chunk_size=64) -> Table:
    """Reference D (value stripes, chunks in a loop) for several ``block_dv``, and with the state
    update moved before the write-back."""
    q, k, v = _inputs(B, T, H, DK, DV, seed)
    a = ref.recurrent(q, k, v)[0]
    whole = ref.seq_in_loop(q, k, v, chunk_size, block_dv=DV)[0]
    table = Table([text(zh="变体", en="variant"), "rel L2 vs A",
                   text(zh="与 block_dv=DV 逐位相同", en="bitwise equal to block_dv=DV")], formats=[None, sci, None])
    for block_dv in (32, 64, DV):
        d = ref.seq_in_loop(q, k, v, chunk_size, block_dv=block_dv)[0]
        table.rows.append([f"D, block_dv = {block_dv}", rel_l2(d, a), bool(torch.equal(d, whole))])
    moved = ref.seq_in_loop(q, k, v, chunk_size, block_dv=32, update_first=True)[0]
    table.rows.append([text(zh="D，状态更新挪到写回之前", en="D, state update before the write-back"), rel_l2(moved, a),
                       bool(torch.equal(moved, whole))])
    return table
# --8<-- [end:seq_in_loop_agreement]


def _gflop(x: float) -> str:
    return f"{x / 1e9:.3f}"


# --8<-- [start:flop_ledger]
def flop_ledger(D: int = 64, C: int = 64, Ns=(512, 2048, 8192, 16384, 65536)) -> Table:
    """Section 6.3: step (1) of the sequence-in-grid kernel against the ideal chunked count and
    causal softmax attention."""
    table = Table(["N", "NC", text(zh="冗余 (NC-1)/2", en="redundancy (NC-1)/2"),
                   text(zh="序列在 grid 里的步骤①，GFLOP", en="seq-in-grid step (1), GFLOP"),
                   text(zh="理想分块，GFLOP", en="ideal chunked, GFLOP"), text(zh="因果 FA，GFLOP", en="causal FA, GFLOP"),
                   text(zh="序列在 grid 里 / FA", en="seq-in-grid / FA"), text(zh="理想 / FA", en="ideal / FA")],
                  formats=[None, None, "{:.1f}x", _gflop, _gflop, _gflop, "{:.3f}", "{:.3f}"])
    for N in Ns:
        grid = ledger.seq_in_grid_state_flops(N, D, C)
        ideal = ledger.chunked_ideal_flops(N, D, C)
        fa = ledger.causal_attention_flops(N, D)
        table.rows.append([N, N // C, ledger.redundancy(N, C), grid, ideal, fa, grid / fa, ideal / fa])
    return table
# --8<-- [end:flop_ledger]


def chunk_size_choice(D: int = 64, Cs=(32, 64, 128, 256), threads: int = 128) -> Table:
    """The constant ``D / (2 BC)`` that the sequence-in-grid kernel keeps against causal FA, and
    the fp32 registers per thread the ``BC x BC`` score tile ``A`` alone needs."""
    table = Table(["BC", "D/(2 BC)", text(zh="A fragment，每线程 fp32 寄存器数", en="A fragment, fp32 registers per thread")],
                  formats=[None, "{:.3f}", None])
    for C in Cs:
        table.rows.append([C, D / (2 * C), C * C // threads])
    return table


# --8<-- [start:out_of_grid]
def sequence_out_of_grid(D: int = 64, C: int = 64, Ns=(8192, 16384, 32768, 65536)) -> Table:
    """Section 6.4.2: state-update GEMMs with the sequence in the grid and in a loop. The
    in-loop column counts the updates only (``2 N D^2``); with the read-out it is twice that."""
    table = Table(["N", text(zh="序列在 grid 里的步骤①，GFLOP", en="seq-in-grid step (1), GFLOP"),
                   text(zh="序列在循环里的状态更新，GFLOP", en="seq-in-loop state updates, GFLOP"),
                   text(zh="比值", en="ratio"),
                   text(zh="序列在循环里的更新 + 读出，GFLOP", en="seq-in-loop updates + read-out, GFLOP")],
                  formats=[None, _gflop, _gflop, "{:.1f}x", _gflop])
    for N in Ns:
        grid = ledger.seq_in_grid_state_flops(N, D, C)
        loop = ledger.seq_in_loop_state_flops(N, D, C)
        table.rows.append([N, grid, loop, grid / loop, 2 * loop])
    return table
# --8<-- [end:out_of_grid]


def fused_or_split(B=1, T=32768, H=32, D=128, C=64) -> Table:
    """Section 6.4.3: what the per-chunk state snapshots of a split design cost in HBM."""
    snap = ledger.state_snapshot_bytes(B, T, H, D, D, C, elem_bytes=2)
    kv = B * T * H * 2 * D * 2
    table = Table([text(zh=f"项目（B={B}, T={T}, H={H}, D={D}, chunk {C}, bf16）",
                        en="quantity (B=%d, T=%d, H=%d, D=%d, chunk %d, bf16)" % (B, T, H, D, C)), "MiB"],
                  formats=[None, "{:.0f}"])
    table.rows.append([text(zh="状态快照 h [B, T/C, H, D, D]", en="state snapshots h [B, T/C, H, D, D]"), snap / 2**20])
    table.rows.append([text(zh="K、V 输入合计", en="K and V inputs together"), kv / 2**20])
    return table
