"""Run 147 (prepared 2026-12-07): GDN's pass traced, warpgroup by warpgroup, chunk by chunk.

Runs 139 to 145 guessed at what keeps ``inverse_state_output_pass`` (0.51 ms at (1, 8192, 96, 128), about 4.0 us a
chunk) behind FlashQLA's fused kernel (0.41 ms, 3.2 us a chunk) with the same warpgroups, and removing the 64
barriers a chunk (whole_stores) changed nothing. This measures instead: the pass compiled with ``trace=True`` writes
the SM's clock at 21 points of every chunk (``scalar_gate.TRACE_EVENTS``: each warpgroup's waits and GEMMs), and the
script prints, for the default and each form under test, the median over blocks and chunks of every event's time
after the chain publishes the chunk's state, the chunk's period, and the pass's time with and without the trace (what
the stamps cost). Rows to ``$OUT/run147.jsonl``.

    python results/tuning/run147-trace.py --warm
"""
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from harness import compile_in_processes, log, script  # noqa: E402

run140 = script("run140-gdn.py")

RUN = "run147"
SHAPES = [(1, 8192, 96, 128), (1, 32768, 32, 128)]
FORMS = {"default": {}, "whole_stores": {"whole_stores": True}, "chain_first 1": {"chain_first": 1},
         "chain_first 2": {"chain_first": 2}, "gates_inverse": {"gates_inverse": True},
         "p_in_registers": {"p_in_registers": True},
         "whole_stores p_in_registers": {"whole_stores": True, "p_in_registers": True},
         "all_in_registers": {"whole_stores": True, "p_in_registers": True, "v_in_registers": True},
         "chain_scales_keys": {"whole_stores": True, "p_in_registers": True, "v_in_registers": True,
                               "chain_scales_keys": True}}
if "--forms" in sys.argv:                      # a comma-separated choice of FORMS (run 149)
    FORMS = {name: FORMS[name] for name in sys.argv[sys.argv.index("--forms") + 1].split(",")}


def passes(D, form, trace):
    from kda.kernels import scalar_gate
    from kda.kernels.build import compile_program

    return compile_program(scalar_gate.inverse_state_output_pass, (), DK=D, DV=D, chunk_size=64, dtype="bfloat16",
                           **FORMS[form], **({"trace": True} if trace else {}))


def warm_one(i):
    form, trace = list(FORMS)[i // 2], bool(i % 2)
    passes(128, form, trace)
    return {"what": "compiled", "form": form, "trace": trace}


def arguments(B, T, H, D, trace_blocks=None):
    """The pass's arguments at this shape: the first kernel's ``G`` and ``Tb`` made from fresh inputs, no states;
    ``ht`` a zeroed trace where ``trace_blocks`` is given."""
    from kda import launch
    from kda.kernels import scalar_gate
    from kda.kernels.scalar_gate import TRACE_EVENTS

    q, k, v, g, beta = run140.dense_inputs(B, T, H, D)
    G, Tb = scalar_gate.scalar_gate_inverse(k, g, beta, H)
    state = launch.stand_in(4, torch.float32, "cuda")
    ht = state if trace_blocks is None else torch.zeros(trace_blocks, (T + 63) // 64, len(TRACE_EVENTS),
                                                        device="cuda")
    table = launch.stand_in(1, torch.int32, "cuda")
    o = torch.empty_like(v)
    return [q, k, v, Tb, G, D ** -0.5, 0, state, o, ht, table, table, table]


def timeline(trace):
    """Every event's median time (cycles) after the chain publishes the chunk's state, over blocks and chunks (the
    first four and the last left out), and the median period between two chunks' publications."""
    from kda.kernels.scalar_gate import TRACE_EVENTS

    ref = trace[:, :, TRACE_EVENTS.index(("chain", "S published"))]
    body = slice(4, trace.shape[1] - 1)
    rel = (trace - ref[:, :, None])[:, body, :]
    period = (ref[:, 1:] - ref[:, :-1])[:, body].median().item()
    events = {f"{wg}: {point}": round(rel[:, :, e].median().item()) for e, (wg, point) in enumerate(TRACE_EVENTS)}
    return period, dict(sorted(events.items(), key=lambda kv: kv[1]))


def clock_mhz():
    try:                                               # through pynvml, which the machine may lack
        return torch.cuda.clock_rate()
    except Exception:  # noqa: BLE001
        return None


def main():
    from kda.bench import median_ms

    for B, T, H, D in SHAPES:
        case = f"{B}x{T}x{H}x{D}"
        plain_args = arguments(B, T, H, D)
        traced_args = arguments(B, T, H, D, trace_blocks=B * H)
        for form in FORMS:
            plain, traced = passes(D, form, False), passes(D, form, True)
            ms = median_ms(lambda: plain(*plain_args))
            traced_ms = median_ms(lambda: traced(*traced_args))
            traced_args[8].zero_()
            traced(*traced_args)
            torch.cuda.synchronize()
            period, events = timeline(traced_args[8].cpu())
            log(RUN, {"case": case, "form": form, "ms": round(ms, 4), "traced_ms": round(traced_ms, 4),
                      "us_per_chunk": round(1000 * ms / ((T + 63) // 64), 3), "period_cycles": round(period),
                      "clock_MHz": clock_mhz(),
                      "events_cycles": events})


if __name__ == "__main__":
    if "--warm" in sys.argv:
        compile_in_processes(RUN, 2 * len(FORMS), warm_one)
    main()
