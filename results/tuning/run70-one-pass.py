"""Run 70 (H200, prepared): one warp-specialised pass for levels 2 to 4, and what it would give GDN.

``kernels.level3.seq_in_loop_scalar`` now takes ``gate`` (``"per_token"``, ``"constant"``, ``"none"``)
and ``delta``: level 3 runs it with per-token gates, level 2 with a constant one, and level 4's
``state_output_pass`` is the same factory with no gate and the delta rule's chain (``V_new = U - W S``
to shared memory). Before, level 4 had a copy of the pass of its own (run 68's, 0.597 ms at the
headline shape). The generated CUDA of the three is main's (3ccff27) up to buffer names (compiled
and compared on the CPU). Here:

1. Level 4: ``state_output_pass`` against the float64 stages (tails, states in and out, outputs
   poisoned), timed beside ``kda.delta_rule`` and fla's ``chunk_delta_rule`` (record of 7ed8b80:
   pass 0.598 ms, call 1.384 ms checked, fla 2.106).
2. Levels 2 and 3: ``decay_attention`` and the scalar ``gated_attention`` timed (record of 7ed8b80:
   0.425 and 0.550 ms), to see that the flags cost nothing where they are off; and level 1's
   operation by the same pass with ``gate="none"`` beside ``kda.linear_attention`` (0.485 ms in the
   record, level 1's pipelined kernel): level 2's pass beat its pipelined kernel by 20%.
3. GDN: ``seq_in_loop_scalar(gate="per_token", delta=True)`` fed ``chunk_intra``'s W and U (scalar
   gate) and ``chunk_cumsum``'s G, against level 5's ``gated_state_output_pass`` on the same chunk
   form (and the float64 recurrence on small shapes), then both passes timed at (1, 32768, 32, 128).
   The pass of record reads Qw, Kw, A_qk, the decays, W and U; this one reads q, k, W, U and G. If it
   is as fast, ``chunk_intra`` need not write Qw, Kw and A_qk for GDN (670 MB of its 2 GB at that
   shape), the lead for #15 (GDN at FlashQLA's 0.678 ms against 1.687).

    python results/tuning/run70-one-pass.py compile     # then each part in its own process
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import ROOT, compile_in_processes, each_in_process, log  # noqa: E402

sys.path.insert(0, ROOT)
RUN = "run70"
GDN_VARIANTS = {"gdn, 2 slots": dict(slots=2, out_groups=2), "gdn, 3 slots": dict(slots=3, out_groups=2)}


def compile_one(i):
    from kda.kernels import level3, level4
    from kda.kernels.build import SM90A, compile_program, ptxas_report
    cases = [("level 4", level4.state_output_pass, {}), ("level 4, states", level4.state_output_pass,
                                                         dict(initial_state=True, final_state=True))]
    cases += [(name, level3.seq_in_loop_scalar, dict(gate="per_token", delta=True, initial_state=True,
                                                      final_state=True, **params))
              for name, params in GDN_VARIANTS.items()]
    name, fn, params = cases[i]
    row = {"what": "compile", "variant": name}
    try:
        return {**row, **ptxas_report(compile_program(fn, (), target=SM90A, DK=128, DV=128, dtype="bfloat16",
                                                      **params))}
    except Exception as e:  # noqa: BLE001
        return {**row, "error": repr(e)[-800:]}


def level4_part(_):
    import torch
    from fla.ops.delta_rule import chunk_delta_rule

    import kda
    from kda.bench import median_ms, random_qkv
    from kda.kernels import level3, level4
    from kda.kernels.build import compile_program
    from kda.metrics import rel_l2
    from kda.reference import level4 as ref4
    from kda.reference.common import from_chunks, to_chunks

    wy = compile_program(level4.chunk_wy, (), DK=128, DV=128, dtype="bfloat16")
    no_gate = torch.empty(1, device="cuda")
    for B, T, H in [(2, 1037, 4), (1, 448, 3), (1, 449, 3), (1, 8192, 32)]:
        q, k, v = random_qkv(B, T, H, 128, 128, seed=T)
        k = ref4.l2_normalize(k.float()).bfloat16()
        beta = torch.rand(B, T, H, device="cuda")
        W, U = torch.empty_like(k), torch.empty_like(v)
        wy(k, v, beta, W, U, torch.empty(1, 1, 1, 1, device="cuda"), torch.zeros(2, dtype=torch.int32, device="cuda"))
        h0 = torch.randn(B, H, 128, 128, device="cuda")
        o, ht = torch.full_like(v, float("nan")), torch.full_like(h0, float("nan"))
        compile_program(level4.state_output_pass, (), DK=128, DV=128, dtype="bfloat16", initial_state=True,
                        final_state=True)(q, k, U, W, no_gate, 128 ** -0.5, h0, o, ht)
        Qc, Kc, Wc, Uc = (to_chunks(x.double(), 64) for x in (q * 128 ** -0.5, k, W, U))
        snapshots, v_new, final = ref4.state_pass(Kc, Wc, Uc, h0.double())
        log(RUN, {"what": "check", "variant": "level 4", "shape": [B, T, H, 128],
                  "nan": bool(o.isnan().any() or ht.isnan().any()),
                  "o_rel": rel_l2(o, from_chunks(ref4.chunk_output(Qc, Kc, snapshots, v_new), T)),
                  "ht_rel": rel_l2(ht, final)})
    q, k, v = random_qkv(1, 32768, 32, 128, 128, seed=70)
    k = ref4.l2_normalize(k.float()).bfloat16()
    beta = torch.rand(1, 32768, 32, device="cuda").bfloat16()
    W, U, o = torch.empty_like(k), torch.empty_like(v), torch.empty_like(v)
    wy(k, v, beta.float(), W, U, torch.empty(1, 1, 1, 1, device="cuda"),
       torch.zeros(2, dtype=torch.int32, device="cuda"))
    stand_in = torch.empty(1, 1, 1, 1, device="cuda")
    fused = compile_program(level4.state_output_pass, (), DK=128, DV=128, dtype="bfloat16")
    plain = compile_program(level3.seq_in_loop_scalar, (), DK=128, DV=128, dtype="bfloat16", gate="none")
    no_w = torch.empty(1, 1, 1, 1, device="cuda", dtype=torch.bfloat16)
    alpha = 1 - 2.0 ** (-5 - torch.arange(32, dtype=torch.float64))
    g = torch.nn.functional.logsigmoid(torch.randn(1, 32768, 32, device="cuda"))
    for label, fn in {"state_output_pass": lambda: fused(q, k, U, W, no_gate, 128 ** -0.5, stand_in, o, stand_in),
                      "kda.delta_rule": lambda: kda.delta_rule(q, k, v, beta),
                      "kda.delta_rule, check_values=False": lambda: kda.delta_rule(q, k, v, beta, check_values=False),
                      "fla chunk_delta_rule": lambda: chunk_delta_rule(q, k, v, beta, scale=128 ** -0.5)[0],
                      "kda.linear_attention": lambda: kda.linear_attention(q, k, v),
                      "level 1 by the pass, gate='none'": lambda: plain(q, k, v, no_w, no_gate, 128 ** -0.5, stand_in,
                                                                      o, stand_in),
                      "kda.decay_attention": lambda: kda.decay_attention(q, k, v, alpha),
                      "kda.gated_attention, scalar": lambda: kda.gated_attention(q, k, v, g)}.items():
        log(RUN, {"what": "time", "T": 32768, "stage": label, "ms": median_ms(fn)})


def gdn_part(name):
    import torch

    from kda.bench import median_ms, random_qkv
    from kda.gated_delta import kernel_inputs, prepare_chunks, run_state_pass, state_pass_launch
    from kda.kernels import level3
    from kda.kernels.build import compile_program
    from kda.metrics import rel_l2
    from kda.reference import level0 as ref0
    from kda.reference import level4 as ref4

    def pieces(B, T, H, seed):
        q, k, v = random_qkv(B, T, H, 128, 128, seed=seed)
        k = ref4.l2_normalize(k.float()).bfloat16()
        g = torch.nn.functional.logsigmoid(torch.randn(B, T, H, device="cuda"))
        beta = torch.rand(B, T, H, device="cuda")
        q, k, g4 = kernel_inputs(q, k, g, False)
        form = prepare_chunks(q, k, v, g4, beta, 128 ** -0.5)
        G = torch.zeros(B, H, -(-T // 64) * 64, device="cuda")
        compile_program(level3.chunk_cumsum, (), D=1)(g4, G.view(*G.shape, 1),
                                                      torch.zeros(2, dtype=torch.int32, device="cuda"))
        return q, k, v, g, beta, form, G

    def unified(states):
        return compile_program(level3.seq_in_loop_scalar, (), DK=128, DV=128, dtype="bfloat16", gate="per_token",
                               delta=True, initial_state=states, final_state=states, **GDN_VARIANTS[name])

    for B, T, H in [(2, 1037, 4), (1, 449, 3), (1, 8192, 32)]:
        q, k, v, g, beta, form, G = pieces(B, T, H, seed=T)
        h0 = torch.randn(B, H, 128, 128, device="cuda")
        o, ht = torch.full_like(v, float("nan")), torch.full_like(h0, float("nan"))
        unified(True)(q, k, form.U, form.W, G, 128 ** -0.5, h0, o, ht)
        o_rec, ht_rec = run_state_pass(form, h0)
        row = {"what": "check", "variant": name, "shape": [B, T, H, 128], "nan": bool(o.isnan().any() or ht.isnan().any()),
               "o_vs_record": rel_l2(o, o_rec.double()), "ht_vs_record": rel_l2(ht, ht_rec.double())}
        if T < 2000:
            ref_o, ref_ht = ref0.recurrent(q.double() * 128 ** -0.5, k, v, g, beta, h0, True)
            row.update(o_rel=rel_l2(o, ref_o), ht_rel=rel_l2(ht, ref_ht), record_o_rel=rel_l2(o_rec, ref_o))
        log(RUN, row)
    q, k, v, g, beta, form, G = pieces(1, 32768, 32, seed=70)
    o = torch.empty_like(v)
    stand_in = torch.empty(1, 1, 1, 1, device="cuda")
    kern = unified(False)
    log(RUN, {"what": "time", "variant": name, "T": 32768, "stage": "unified pass (q, k, U, W, G)",
              "ms": median_ms(lambda: kern(q, k, form.U, form.W, G, 128 ** -0.5, stand_in, o, stand_in))})
    launch, _, _ = state_pass_launch(form, None, output_final_state=False)
    log(RUN, {"what": "time", "variant": name, "T": 32768, "stage": "gated_state_output_pass of record",
              "ms": median_ms(launch)})


def part(name):
    return level4_part(name) if name == "level 4" else gdn_part(name)


if __name__ == "__main__":
    if "compile" in sys.argv[1:]:
        compile_in_processes(RUN, 2 + len(GDN_VARIANTS), compile_one)
    each_in_process(RUN, ["level 4", *GDN_VARIANTS], part, limit_s=150)
