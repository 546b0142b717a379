"""Run 108 (prepared 2026-12-05): the intra-card split with warm-up starts (``kda.distributed.WARMUP_STARTS``),
timed beside the exact split, the unsplit op and FlashQLA's automatic split, bf16, unit keys, beta in [0, 1],
logsigmoid gates; every kda row checked against the unsplit op. At (1, 131072, 4, 128) KDA and GDN (cp/split_latency's
shape); at (1, 32768, 32, 128) and (1, 16384, 32, 128) GDN through the scalar-gate pass split into 2, 4 and 8 runs
(issue 15: the pass has one block of 128 columns per head, 32 blocks for 132 SMs); at (1, 32768, 4) and (1, 8192, 4)
where the exact split lost. FlashQLA's rows with ``FLASHQLA=1`` (cp/split_latency and level5/gdn_latency hold
its times). Rows to ``$OUT/run108.jsonl``.

    FLA_FLASH_QLA=0 python results/tuning/run108-warmup.py
"""
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import harness  # noqa: E402

RUN = "run108"


def inputs(B, T, H, D=128, seed=7):
    from kda.bench import random_qkv
    from kda.reference import level4 as ref

    q, k, v = random_qkv(B, T, H, D, D, seed=seed)
    k = ref.l2_normalize(k.float()).bfloat16()
    gen = torch.Generator(device="cuda").manual_seed(seed + 1)
    beta = torch.rand(B, T, H, generator=gen, device="cuda").bfloat16()
    g_kda = torch.nn.functional.logsigmoid(torch.randn(B, T, H, D, generator=gen, device="cuda"))
    g_gdn = torch.nn.functional.logsigmoid(torch.randn(B, T, H, generator=gen, device="cuda"))
    return q, k, v, beta, g_kda, g_gdn


def main():
    import flash_qla

    import kda
    from kda import distributed, gated_delta

    def set_switches(warmup, scalar_split):
        distributed.WARMUP_STARTS = warmup
        distributed.SCALAR_GATE_SPLIT = scalar_split

    # KDA at 32 heads: two runs let the state pass take 64 value columns per block (run 39: faster where they fill)
    shapes = [((1, 32768, 32), ("gdn", "kda")), ((1, 131072, 4), ("gdn", "kda")), ((1, 8192, 4), ("kda", "gdn")),
              ((1, 16384, 32), ("gdn",)), ((1, 32768, 4), ("kda", "gdn")),
              ((1, 8192, 96), ("gdn",))]       # added for run 112: 96 blocks of the scalar-gate pass on 132 SMs
    pieces_of = lambda default: [int(p) for p in os.environ["PIECES"].split(",")] if os.environ.get("PIECES") \
        else default                                 # e.g. PIECES=3,4,6 (run 112)
    if os.environ.get("SHAPES"):                      # e.g. SHAPES=0,1: a short call's part of the list
        shapes = [shapes[int(i)] for i in os.environ["SHAPES"].split(",")]
    for (B, T, H), ops in shapes:
        q, k, v, beta, g_kda, g_gdn = inputs(B, T, H)
        for op in ops:
            g = g_kda if op == "kda" else g_gdn
            plain = kda.chunk_kda if op == "kda" else kda.chunk_gated_delta_rule
            first = []
            row = lambda **kw: {"stage": "warmup", "op": op, "B": B, "T": T, "H": H, **kw}
            set_switches(False, False)
            harness.timed(RUN, row(impl="unsplit"), lambda: plain(q, k, v, g, beta)[0], harness.against(first))
            variants = [("exact, auto", False, False, None), ("warmup, auto", True, False, None)]
            if op == "gdn":
                variants += [("scalar-gate warmup, auto", True, True, None)]
                variants += [(f"scalar-gate warmup, {p}", True, True, p) for p in pieces_of((2, 4, 8))]
            else:
                variants += [(f"warmup, {p}", True, False, p) for p in pieces_of((2, 4, 16))]
            for name, warmup, scalar_split, pieces in variants:
                set_switches(warmup, scalar_split)
                taken = []
                chosen = distributed.warmup_chunks
                distributed.warmup_chunks = lambda falls: taken.append(chosen(falls)) or taken[-1]
                harness.timed(RUN, row(impl=name, window=taken),
                              lambda: distributed.split_forward(q, k, v, g, beta, pieces)[0], harness.against(first))
                distributed.warmup_chunks = chosen
            set_switches(True, False)                        # the op itself, routed (added for run 109)
            gated_delta.SPLIT_IN_OP = True
            harness.timed(RUN, row(impl="op, SPLIT_IN_OP"), lambda: plain(q, k, v, g, beta)[0], harness.against(first))
            gated_delta.SPLIT_IN_OP = False
            set_switches(False, False)
            if op == "gdn" and os.environ.get("FLASHQLA", "0") == "1":      # its compile: a minute of a short call
                for auto_cp in (True, False):
                    harness.timed(RUN, row(impl=f"FlashQLA auto_cp={auto_cp}"),
                                  lambda: flash_qla.chunk_gated_delta_rule(q, k, v, g, beta, scale=128 ** -0.5,
                                                                           auto_cp=auto_cp)[0],
                                  harness.against(first))
        del q, k, v, beta, g_kda, g_gdn
        torch.cuda.empty_cache()
    print("scalar-gate columns", gated_delta.SCALAR_GATE_COLUMNS)


if __name__ == "__main__":
    main()
