"""Run 144 (prepared 2026-12-06): packed short sequences by ``single_chunk_output`` (GDN) and
``single_chunk_gated_output`` (KDA), timed.

Run 143 took GDN's op on 1024 packed sequences of 1 to 64 tokens apart: 2.17 ms, of which the pass 1.63, against
0.89 ms for the same 32768 tokens as one sequence (H100). The pass carries a group of sequences one after another
through its chain, one block per SM, so a short sequence costs it a whole chunk's latency. ``single_chunk_output``
(``scalar_gate.SINGLE_CHUNK_OUTPUT``) gives every (sequence, head, 64 value columns) a small block of its own, several
per SM, where the host knows that no sequence is longer than a chunk; ``single_chunk_gated_output``
(``gated_state_pass.SINGLE_CHUNK_OUTPUT``) does the same for KDA's state pass (run 143: 3.68 ms against 2.12 for one
sequence). This times both ops with the switches off and on, kernel by kernel, on the short cases (with and without
states), beside the same tokens as one sequence and the peers (FlashQLA and fla's Triton GDN; fla's ``chunk_kda``); the
outputs of the two forms against each other (relative L2). Rows to ``$OUT/run144.jsonl``.

    FLA_FLASH_QLA=0 python results/tuning/run144-gdn.py --warm
"""
import importlib.util
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from harness import compile_in_processes, log, stage_times, time_stages  # noqa: E402

spec = importlib.util.spec_from_file_location("run140_gdn", os.path.join(HERE, "run140-gdn.py"))
run140 = importlib.util.module_from_spec(spec)
spec.loader.exec_module(run140)

RUN = "run144"


def short_lengths(case):
    gen = torch.Generator().manual_seed(144)
    if case == "8192 sequences of 1 to 8 tokens":
        return torch.randint(1, 9, (8192,), generator=gen).tolist()
    return run140.lengths("1024 sequences of 1 to 64 tokens")


CASES = ["1024 sequences of 1 to 64 tokens", "8192 sequences of 1 to 8 tokens"]


def cases():
    for case in CASES:
        lens = short_lengths(case)
        cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), device="cuda")
        yield case, run140.dense_inputs(1, int(cu[-1]), 32, 128), cu


def use(single):
    from kda.kernels import gated_state_pass, scalar_gate

    scalar_gate.SINGLE_CHUNK_OUTPUT = single
    gated_state_pass.SINGLE_CHUNK_OUTPUT = single


def ops(q, k, g):
    """(name, the op, its gate): GDN with the gate per head, KDA with one per channel (logsigmoid, as run 141's)."""
    from kda import gated_delta

    g_kda = torch.nn.functional.logsigmoid(torch.randn(*k.shape, device="cuda", generator=torch.Generator(
        device="cuda").manual_seed(5)))
    return [("GDN", gated_delta.chunk_gated_delta_rule, g), ("KDA", gated_delta.chunk_kda, g_kda)]


def warm_one(i):
    use([False, True][i])
    for _, (q, k, v, g, beta), cu in cases():
        h0 = torch.zeros(cu.shape[0] - 1, 32, 128, 128, device="cuda")
        for _, op, gate in ops(q, k, g):
            for state in (None, h0):
                op(q, k, v, gate, beta, initial_state=state, cu_seqlens=cu, output_final_state=state is not None)
            op(q, k, v, gate, beta)
    torch.cuda.synchronize()
    return {"what": "warm", "single": i == 1}


def main():
    import flash_qla
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla_gdn
    from fla.ops.kda import chunk_kda as fla_kda

    from kda.bench import median_ms
    from kda.metrics import rel_l2

    assert os.environ.get("FLA_FLASH_QLA") == "0"
    time_stages()
    for name, (q, k, v, g, beta), cu in cases():
        h0 = torch.randn(cu.shape[0] - 1, 32, 128, 128, device="cuda")
        D = q.shape[-1]
        for op_name, op, gate in ops(q, k, g):
            case = f"{op_name}, {name}"
            for states in ("no states", "initial and final states"):
                kw = dict(initial_state=h0, output_final_state=True) if states != "no states" else {}
                outs = {}
                for single in (False, True):
                    use(single)
                    fn = lambda: op(q, k, v, gate, beta, cu_seqlens=cu, **kw)
                    outs[single] = fn()
                    impl = f"kda {'single chunk' if single else 'pass'}, {states}"
                    log(RUN, {"case": case, "impl": impl, "ms": round(median_ms(fn), 4)})
                    stage_times(RUN, {"case": case, "impl": impl, "what": "stages"}, fn)
                use(False)
                log(RUN, {"case": case, "states": states, "finite": bool(torch.isfinite(outs[True][0]).all()),
                          "rel_l2 single vs pass": [rel_l2(x, y) for x, y in zip(outs[True], outs[False])
                                                    if x is not None]})
            one = lambda: op(q, k, v, gate, beta)
            log(RUN, {"case": case, "impl": "kda, the same tokens as one sequence", "ms": round(median_ms(one), 4)})
            if op_name == "GDN":
                peers = {"FlashQLA 0.1.3": lambda: flash_qla.chunk_gated_delta_rule(q, k, v, g, beta, scale=D ** -0.5,
                                                                                     cu_seqlens=cu)[0],
                         "fla Triton": lambda: fla_gdn(q, k, v, g, beta, scale=D ** -0.5, cu_seqlens=cu)[0]}
            else:
                peers = {"fla chunk_kda": lambda: fla_kda(q, k, v, gate, beta, scale=D ** -0.5, cu_seqlens=cu)[0]}
            for impl, fn in peers.items():
                try:
                    log(RUN, {"case": case, "impl": impl, "ms": round(median_ms(fn), 4)})
                except Exception as e:  # noqa: BLE001
                    log(RUN, {"case": case, "impl": impl, "error": f"{type(e).__name__}: {str(e)[:200]}"})
            torch.cuda.empty_cache()


if __name__ == "__main__":
    if "--warm" in sys.argv:
        compile_in_processes(RUN, 2, warm_one)
    main()
