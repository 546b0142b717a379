"""Run 52 (H200): the level-5 state pass over groups of packed sequences, and its state flags.

The packed record of 143d9cf: 1024 sequences of 1 to 64 tokens (H = 32, D = 128) take 6.31 ms
against 2.21 for the same tokens as one sequence. The state pass gave each sequence blocks of its
own (65536 one-chunk blocks there), read a zero initial state and wrote a final state nobody asked
for (2.1 GB each way). Now it starts from zero without a read, writes no state unless asked, and
carries the sequences whose first chunk lies in one window of ``GROUP_CHUNKS`` chunks in one block.
This run times the packed cases of ``snippets/level5/packed_latency.py`` (same lengths, same
inputs) and the state pass alone at windows of 1 (one sequence per block for these lengths), 4,
16, 32 (the default), 64 and 128 chunks, with and without initial and final states; fla's
chunk_kda beside it. Outputs are checked against window 32 bit for bit (the groups change only
which block carries a sequence).

    python results/tuning/run52-packed-groups.py
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import log  # noqa: E402

RUN = "run52"
WINDOWS = [1, 4, 16, 32, 64, 128]


def lengths(case):
    """As ``lengths`` in snippets/level5/packed_latency.py (the same seed and draws)."""
    import torch

    gen = torch.Generator().manual_seed(96)
    if case == "96 random lengths":
        cuts = torch.randperm(32767, generator=gen)[:95].sort().values + 1
        return torch.diff(torch.cat([torch.tensor([0]), cuts, torch.tensor([32768])])).tolist()
    return torch.randint(1, 65, (1024,), generator=gen).tolist()


def main():
    import torch
    from fla.ops.kda import chunk_kda as fla_kda

    from kda import gated_delta
    from kda.bench import median_ms, random_qkv
    from kda.reference import level4 as ref

    H, D = 32, 128
    for case in ["1024 sequences of 1 to 64 tokens", "96 random lengths"]:
        lens = lengths(case)
        T = sum(lens)
        q, k, v = random_qkv(1, T, H, D, D, seed=7)
        k = ref.l2_normalize(k.float()).bfloat16()
        gen = torch.Generator(device="cuda").manual_seed(8)
        beta = torch.rand(1, T, H, generator=gen, device="cuda").bfloat16()
        g = torch.nn.functional.logsigmoid(torch.randn(1, T, H, D, generator=gen, device="cuda"))
        cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], device="cuda")
        h0 = torch.randn(len(lens), H, D, D, device="cuda")
        base = {"run": RUN, "case": case, "T": T, "N": len(lens), "H": H, "D": D}
        log(RUN, {**base, "impl": "fla chunk_kda",
                  "ms": median_ms(lambda: fla_kda(q, k, v, g, beta, scale=D ** -0.5, cu_seqlens=cu.long()))})
        log(RUN, {**base, "impl": "kda, one sequence of the same tokens", "ms": median_ms(lambda: gated_delta.chunk_kda(q, k, v, g, beta))})
        reference = {}
        for window in [32] + [w for w in WINDOWS if w != 32]:
            gated_delta.GROUP_CHUNKS = window
            table = gated_delta.chunk_table(cu.tolist(), "cuda")
            form = gated_delta.prepare_chunks(q, k, v, g, beta, D ** -0.5, table=table)
            for initial, final in [(False, False), (True, True)]:
                state = h0 if initial else None
                o, ht = gated_delta.run_state_pass(form, state, table, final)
                key = (initial, final)
                same = None
                if window == 32:
                    reference[key] = (o, ht)
                else:
                    ref_o, ref_ht = reference[key]
                    same = bool(torch.equal(o, ref_o) and (ht is None or torch.equal(ht, ref_ht)))
                row = {**base, "window": window, "groups": table.seq_groups.shape[0] - 1, "initial": initial,
                       "final": final, "nan": bool(o.isnan().any()), "bit_identical_to_window_32": same,
                       "state_pass_ms": median_ms(lambda: gated_delta.run_state_pass(form, state, table, final))}
                if not initial and not final:
                    row["chunk_kda_ms"] = median_ms(lambda: gated_delta.chunk_kda(q, k, v, g, beta, cu_seqlens=cu))
                log(RUN, row)
        gated_delta.GROUP_CHUNKS = 32


if __name__ == "__main__":
    main()
