"""Run 64 (H200): where the checked call should read its flags back.

Run 63 (torch.profiler, 6315daa) found the checked GDN and KDA calls losing their time in one gap:
the GPU idles 73 to 97 us after the read-back of the two value flags (1.5 us of copy), until the
state pass is launched; the unchecked calls show 1 to 2 us there. The host, once the flags are
back, still looks up the compiled pass, allocates the output and the final state, and launches.
Level 3's checked call (0.618 against 0.579 ms unchecked, records of 1817ec5) has the same gap.

Timed here, same process, back-to-back calls (``kda.bench.median_ms``), at (1, 32768, 32, 128)
bf16 for GDN (``chunk_gated_delta_rule``) and level 3's scalar ``gated_attention``:

* ``as is``: the public call, checked and not;
* ``prepared``: everything for the second kernel (the compiled pass, its outputs, its arguments)
  made before the read-back, so that only the launch follows it;
* ``after``: both kernels launched, then the flags read back (the error raised after the second
  kernel; its outputs are dropped). The call is then synchronous: the next call's host work
  no longer overlaps the GPU.

And the host's own costs, ``time.perf_counter`` medians of 200 with the GPU busy: one launch of the
state pass, the lookup of the compiled pass, one output allocation, ``flags.tolist()`` on an idle
stream.

    python results/tuning/run64-check-placement.py
"""
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import ROOT, log, scalar_gates  # noqa: E402

sys.path.insert(0, ROOT)
RUN = "run64"


def host_us(fn, n=200):
    import torch
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    torch.cuda.synchronize()
    return statistics.median(times) * 1e6


def gdn():
    import torch

    from kda import gated_delta as gd
    from kda import ops, validate
    from kda.bench import median_ms
    from kda.kernels import level5
    from kda.kernels.build import compile_program, sm_count
    from kda.reference import level4 as ref4

    B, T, H, D = 1, 32768, 32, 128
    gen = torch.Generator(device="cuda").manual_seed(64)
    q, k, v = (torch.randn(B, T, H, D, device="cuda", generator=gen).bfloat16() for _ in range(3))
    q, k = ref4.l2_normalize(q.float()).bfloat16(), ref4.l2_normalize(k.float()).bfloat16()
    g = torch.nn.functional.logsigmoid(torch.randn(B, T, H, device="cuda", generator=gen)) / 16
    beta = torch.rand(B, T, H, device="cuda", generator=gen)
    scale = D ** -0.5
    g1 = g.unsqueeze(-1)

    def pass_launch(form):
        """The compiled state pass and its arguments, ready to launch (``run_state_pass``'s body)."""
        state_pass = compile_program(level5.gated_state_output_pass, (), DK=D, DV=D, chunk_size=64,
                                     block_dv=gd.state_pass_columns(B, H, D, sm_count(q.device)),
                                     dtype="bfloat16", varlen=False, initial_state=False, final_state=False)
        h0, ht = ops.state_arguments(None, False, B, H, D, D, q.device)
        o = ops.new_output((B, T, H, D), q.dtype, q.device)
        return state_pass, (*form, h0, o, ht, *[ops.stand_in(1, torch.int32, q.device)] * 3), o

    def prepared():
        flags = torch.zeros(2, dtype=torch.int32, device="cuda")
        form = gd.prepare_chunks(q, k, v, g1, beta, scale, flags)
        state_pass, args, o = pass_launch(form)
        validate.raise_flagged_values(flags, g, beta)
        state_pass(*args)
        return o

    def after():
        flags = torch.zeros(2, dtype=torch.int32, device="cuda")
        form = gd.prepare_chunks(q, k, v, g1, beta, scale, flags)
        o, _ = gd.run_state_pass(form, None)
        validate.raise_flagged_values(flags, g, beta)
        return o

    import kda
    ref = kda.chunk_gated_delta_rule(q, k, v, g, beta)[0]
    for name, fn in [("as is, checked", lambda: kda.chunk_gated_delta_rule(q, k, v, g, beta)[0]),
                     ("as is, check_values=False",
                      lambda: kda.chunk_gated_delta_rule(q, k, v, g, beta, check_values=False)[0]),
                     ("prepared", prepared), ("after", after)]:
        same = bool(torch.equal(fn(), ref))
        log(RUN, {"op": "GDN", "shape": [B, T, H, D], "variant": name, "equal_to_public": same, "ms": median_ms(fn)})

    flags = torch.zeros(2, dtype=torch.int32, device="cuda")
    form = gd.prepare_chunks(q, k, v, g1, beta, scale, flags)
    state_pass, args, _ = pass_launch(form)
    torch.cuda.synchronize()
    costs = {"launch of the state pass": lambda: state_pass(*args),
             "lookup of the compiled pass and its arguments": lambda: pass_launch(form),
             "one output allocation": lambda: ops.new_output((B, T, H, D), q.dtype, q.device),
             "torch.cuda.device context": lambda: torch.cuda.device(q.device).__enter__(),
             "prepare_chunks launch (host)": lambda: gd.prepare_chunks(q, k, v, g1, beta, scale, flags)}
    for name, fn in costs.items():
        log(RUN, {"what": "host", "cost": name, "us": host_us(fn, 50 if "launch" in name else 200)})
    torch.cuda.synchronize()
    log(RUN, {"what": "host", "cost": "flags.tolist() on an idle stream", "us": host_us(flags.tolist)})


def level3():
    import torch

    import kda
    from kda import gated, ops, validate
    from kda.bench import median_ms, random_qkv
    from kda.kernels import level3 as kernels
    from kda.kernels.build import compile_program

    B, T, H, D = 1, 32768, 32, 128
    q, k, v = random_qkv(B, T, H, D, D, seed=64)
    g = scalar_gates(B, T, H, "logsigmoid", seed=65)
    scale = D ** -0.5
    cumsum = compile_program(kernels.chunk_cumsum, (), D=1, chunk_size=64, gate_dtype="float32")

    def variant(order):
        flags = torch.zeros(2, dtype=torch.int32, device="cuda")
        G = torch.empty(B, H, T, dtype=torch.float32, device="cuda")
        cumsum(g.view(B, T, H, 1), G.view(*G.shape, 1), flags)
        seq = compile_program(kernels.seq_in_loop_scalar, (), DK=D, DV=D, dtype="bfloat16", chunk_size=64,
                              block_dv=32, initial_state=False, final_state=False, **gated.SCALAR_PASS_CONFIG)
        o = ops.new_output((B, T, H, D), q.dtype, q.device)
        h0, ht = ops.state_arguments(None, False, B, H, D, D, q.device)
        if order == "prepared":
            validate.raise_flagged_values(flags, g)
        seq(q, k, v, G, scale, h0, o, ht)
        if order == "after":
            validate.raise_flagged_values(flags, g)
        return o

    ref = kda.gated_attention(q, k, v, g)
    for name, fn in [("as is, checked", lambda: kda.gated_attention(q, k, v, g)),
                     ("as is, check_values=False", lambda: kda.gated_attention(q, k, v, g, check_values=False)),
                     ("prepared", lambda: variant("prepared")), ("after", lambda: variant("after"))]:
        same = bool(torch.equal(fn(), ref))
        log(RUN, {"op": "level 3 scalar", "shape": [B, T, H, D], "variant": name, "equal_to_public": same,
                  "ms": median_ms(fn)})


if __name__ == "__main__":
    for part in (gdn, level3):
        try:
            part()
        except Exception as e:  # noqa: BLE001
            log(RUN, {"part": part.__name__, "error": repr(e)[-600:]})
