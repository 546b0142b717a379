"""Run 149 (prepared 2026-12-07): GDN's op with the pass's operands in registers, timed.

Run 147's trace (H100, (1, 8192, 96, 128)) put numbers on the pass's chunk of about 7,500 cycles: the output
warpgroup's loop that gates ``P`` into shared memory took about 3,400 (4,000 with ``whole_stores``, where it held back
the chain's next state), and warpgroup 1's ``X = V - 2^G K S`` 1,760 to 2,500, reading ``V`` from slots tilelang kept
row by row (a warp's eight rows on the same banks). ``scalar_gate.P_IN_REGISTERS`` gates ``P`` in registers and feeds
``P V_new`` from them; ``V_IN_REGISTERS`` (with ``WHOLE_STORES``) reads ``V`` into registers before ``S`` is ready,
from swizzled slots; ``CHAIN_SCALES_KEYS`` (with both) has the chain scale the keys by ``2^(G_last - G)`` while it
waits, so that warpgroup 1 makes no ``V'``. This times the op through each form, kernel by kernel, the outputs
against the default's bit for bit (``chain_scales_keys`` rounds the scale on the keys: only close), beside FlashQLA
and fla's Triton GDN (run 140's cases: the two dense shapes of issue 15, 96 random lengths and 1024 short sequences).
Rows to ``$OUT/run149.jsonl``.

    FLA_FLASH_QLA=0 python results/tuning/run149-gdn.py --warm
"""
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from harness import compile_in_processes, script  # noqa: E402

run140 = script("run140-gdn.py")

RUN = "run149"
VARIANTS = {"default": {}, "p_in_registers": {"P_IN_REGISTERS": True},
            "whole_stores p_in_registers": {"WHOLE_STORES": True, "P_IN_REGISTERS": True},
            "all_in_registers": {"WHOLE_STORES": True, "P_IN_REGISTERS": True, "V_IN_REGISTERS": True},
            "chain_scales_keys": {"WHOLE_STORES": True, "P_IN_REGISTERS": True, "V_IN_REGISTERS": True,
                                  "CHAIN_SCALES_KEYS": True}}


def use(variant):
    from kda.kernels import scalar_gate

    for switch in ("WHOLE_STORES", "P_IN_REGISTERS", "V_IN_REGISTERS", "CHAIN_SCALES_KEYS"):
        setattr(scalar_gate, switch, VARIANTS[variant].get(switch, False))


def warm_one(i):
    """Each variant's kernels compiled by one call of the op per case (a process of its own)."""
    from kda import gated_delta

    variant = list(VARIANTS)[i]
    use(variant)
    for _, (q, k, v, g, beta), cu in run140.cases():
        gated_delta.chunk_gated_delta_rule(q, k, v, g, beta, cu_seqlens=cu, output_final_state=True)
    torch.cuda.synchronize()
    return {"what": "warm", "variant": variant}


if __name__ == "__main__":
    if "--warm" in sys.argv:
        compile_in_processes(RUN, len(VARIANTS), warm_one)
    run140.compare(RUN, list(VARIANTS), use)
