"""Run 141 (prepared 2026-12-06): GDN's pass with ``whole_stores`` against the default, and both beside FlashQLA.

Run 140 found a first barrier-free form of the pass 40% slower (0.714 ms against 0.509 at (1, 8192, 96, 128)): ``V'``
made in the registers that held ``X`` kept two 64 x 128 float32 tiles alive in warpgroup 1, whose budget is 128
registers, and ptxas spilled 488 bytes. ``inverse_state_output_pass(whole_stores=True)`` stores ``V_new`` first and
makes ``V'`` over it: no spill and no barrier in any step of its loops (on the CPU), and the same sums in the same
order, so the outputs must equal the default's bit for bit. This times the op with ``scalar_gate.WHOLE_STORES`` off
and on, kernel by kernel (``stage_times``), beside FlashQLA (default and ``auto_cp=False``) and fla's Triton GDN,
dense at the two shapes of issue 15 and packed (96 random lengths; 1024 sequences of 1 to 64 tokens), with the
cases and inputs of ``run140-gdn.py``; then KDA's packed state pass the same way (``gated_state_pass.WHOLE_STORES``,
its masked stores whole) beside fla's ``chunk_kda``. Rows to ``$OUT/run141.jsonl``.

    FLA_FLASH_QLA=0 python results/tuning/run141-gdn.py --warm
"""
import importlib.util
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from harness import compile_in_processes, log  # noqa: E402

spec = importlib.util.spec_from_file_location("run140_gdn", os.path.join(HERE, "run140-gdn.py"))
run140 = importlib.util.module_from_spec(spec)
spec.loader.exec_module(run140)

RUN = "run141"
VARIANTS = {"in place (default)": False, "whole stores": True}


def use(whole):
    from kda.kernels import scalar_gate

    scalar_gate.WHOLE_STORES = whole


def warm_one(i):
    """Each variant's kernels compiled by one call of the op per case (a process of its own)."""
    from kda import gated_delta

    name, whole = list(VARIANTS.items())[i]
    use(whole)
    for _, (q, k, v, g, beta), cu in run140.cases():
        gated_delta.chunk_gated_delta_rule(q, k, v, g, beta, cu_seqlens=cu, output_final_state=True)
    torch.cuda.synchronize()
    return {"what": "warm", "variant": name}


def kda_packed():
    """KDA's packed state pass with ``gated_state_pass.WHOLE_STORES`` off and on (its masked ``V_new`` stores, 16
    barriers a chunk, against one whole store), the op beside fla's ``chunk_kda``, outputs bit for bit."""
    from fla.ops.kda import chunk_kda as fla_kda

    from kda import gated_delta
    from kda.bench import median_ms
    from kda.kernels import gated_state_pass

    for case in run140.PACKED:
        lens = run140.lengths(case)
        cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), device="cuda")
        q, k, v, _, beta = run140.dense_inputs(1, int(cu[-1]), 32, 128)
        g = torch.nn.functional.logsigmoid(torch.randn(*k.shape, device="cuda"))
        outs = {}
        for whole in (False, True):
            gated_state_pass.WHOLE_STORES = whole
            fn = lambda: gated_delta.chunk_kda(q, k, v, g, beta, cu_seqlens=cu, output_final_state=True)
            outs[whole] = fn()
            log(RUN, {"case": f"KDA {case}", "impl": f"kda whole_stores={whole}", "ms": round(median_ms(fn), 4)})
        gated_state_pass.WHOLE_STORES = False
        log(RUN, {"case": f"KDA {case}", "same_bits": [torch.equal(x, y) for x, y in zip(outs[False], outs[True])]})
        log(RUN, {"case": f"KDA {case}", "impl": "fla chunk_kda",
                  "ms": round(median_ms(lambda: fla_kda(q, k, v, g, beta, scale=128 ** -0.5, cu_seqlens=cu)[0]), 4)})


def main():
    run140.compare(RUN, list(VARIANTS), lambda name: use(VARIANTS[name]))
    kda_packed()


if __name__ == "__main__":
    if "--warm" in sys.argv:
        compile_in_processes(RUN, 2, warm_one)
    main()
