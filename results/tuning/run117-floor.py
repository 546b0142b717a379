"""Run 117 (prepared 2026-12-06): the op's split after run 116 (its host path cut down; ``SPLIT_IN_OP``), with
runs of 128, 64 and 32 chunks at least (``OP_SPLIT_MIN_RUN_CHUNKS``), against the op unsplit and FlashQLA's
automatic split, bf16, logsigmoid gates, unit keys; every row against the unsplit op. Rows to ``$OUT/run117.jsonl``.

    FLA_FLASH_QLA=0 python results/tuning/run117-floor.py
"""
import os
import sys
from importlib import import_module

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import harness  # noqa: E402

RUN = "run117"


def main():
    import kda
    from kda import distributed, gated_delta

    inputs = import_module("run108-warmup").inputs
    for (B, T, H), ops in [((1, 131072, 4), ("gdn", "kda")), ((1, 65536, 4), ("gdn", "kda")), ((1, 32768, 32), ("gdn",)),
                           ((1, 65536, 16), ("gdn",))]:
        q, k, v, beta, g_kda, g_gdn = inputs(B, T, H)
        for op in ops:
            g = g_kda if op == "kda" else g_gdn
            plain = kda.chunk_kda if op == "kda" else kda.chunk_gated_delta_rule
            first = []
            row = lambda **kw: {"stage": "op split floor", "op": op, "B": B, "T": T, "H": H, **kw}
            gated_delta.SPLIT_IN_OP = False
            harness.timed(RUN, row(impl="op unsplit"), lambda: plain(q, k, v, g, beta)[0], harness.against(first))
            gated_delta.SPLIT_IN_OP = True
            for floor in (128, 64, 32):
                distributed.OP_SPLIT_MIN_RUN_CHUNKS = floor
                harness.timed(RUN, row(impl=f"op, SPLIT_IN_OP, runs of {floor}+ chunks"),
                              lambda: plain(q, k, v, g, beta)[0], harness.against(first))
            distributed.OP_SPLIT_MIN_RUN_CHUNKS = 128
            gated_delta.SPLIT_IN_OP = False
            if op == "gdn" and os.environ.get("FLASHQLA", "1") == "1":
                import flash_qla

                harness.timed(RUN, row(impl="FlashQLA auto_cp=True"),
                              lambda: flash_qla.chunk_gated_delta_rule(q, k, v, g, beta, scale=128 ** -0.5,
                                                                       auto_cp=True)[0], harness.against(first))
        del q, k, v, beta, g_kda, g_gdn
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
