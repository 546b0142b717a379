"""Run 71 (H200, prepared; after run 70): GDN with level 3's pass, ``chunk_intra`` writing W and U only.

GDN is at 0.40x FlashQLA (``kda.chunk_gated_delta_rule`` 1.687 ms at (1, 32768, 32, 128), FlashQLA
0.678; record of 7ed8b80). Its two kernels: ``chunk_intra`` (scalar gate) writes Qw, Kw, the decays,
A_qk, W and U (about 2 GB through HBM at that shape), then ``gated_state_output_pass`` reads them
back. Run 70 times level 3's warp-specialised pass with ``gate="per_token", delta=True``, which
reads q, k, U, W and the chunk-local cumsum G instead: the scores and the row weights it forms
itself. With it, ``chunk_intra`` needs to write only W and U. Here:

* ``chunk_intra`` of record (scalar gate) against a variant without the stores of Qw, Kw, the
  decays and A_qk (source replacements; the scores GEMM still forms A_qk's half, unused), W and U
  compared bit for bit, both timed at (1, 32768, 32, 128) and (1, 8192, 96, 128);
* the pipeline that would replace GDN's: the variant, ``level3.chunk_cumsum`` (G), then the pass of
  run 70, against the float64 recurrence at ragged shapes (states in and out), and timed beside
  ``kda.chunk_gated_delta_rule`` (``check_values=False``), fla's Triton path and FlashQLA.

    python results/tuning/run71-gdn-wu-only.py compile     # then each part in its own process
"""
import functools
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import ROOT, compile_in_processes, each_in_process, intra_module, log  # noqa: E402

sys.path.insert(0, ROOT)
RUN = "run71"
NO_CHUNK_FORM = [
    ("""        store_rows(Rgt_s, Qw, bb, t0, L, bh)
        for i, d in T.Parallel(C, DK):
            Rgt_s[i, d] = T.Cast(ACCUM, Lft_s[C + i, d]) * E_s[i]                   # Kw
        store_rows(Rgt_s, Kw, bb, t0, L, bh)
""", ""),
    ("""        for d in T.Parallel(DK):
            decay[bb, bh, c, d] = T.exp2(G_s[C - 1, d if GD > 1 else 0])
""", ""),
    ("""        for i, j in T.Parallel(C, C):
            Aqk_s[i, j] = T.if_then_else(j <= i, A[i, j] * scale * decay_factor(G_s[i, 0] - G_s[j, 0]), 0.0)
""", ""),
    ("""        store_rows(Aqk_s, A_qk, bb, t0, L, bh)
""", ""),
]
GDN = dict(DK=128, DV=128, dtype="bfloat16", gate_dtype="float32", scalar_gate=True)


@functools.lru_cache(maxsize=None)
def variant():
    """Built once per process: a new module would be a new factory, compiled again."""
    return intra_module("wu_only", NO_CHUNK_FORM)


def compile_one(i):
    from kda.kernels import level3
    from kda.kernels.build import compile_program, ptxas_report
    fn, params, name = [(lambda: variant().chunk_intra, GDN, "chunk_intra, W and U only"),
                        (lambda: level3.seq_in_loop_scalar, dict(DK=128, DV=128, dtype="bfloat16", gate="per_token",
                                                                  delta=True, slots=3, initial_state=True,
                                                                  final_state=True), "pass, states"),
                        (lambda: level3.seq_in_loop_scalar, dict(DK=128, DV=128, dtype="bfloat16", gate="per_token",
                                                                  delta=True, slots=3), "pass")][i]
    try:
        return {"what": "compile", "variant": name, **ptxas_report(compile_program(fn(), (), **params))}
    except Exception as e:  # noqa: BLE001
        return {"what": "compile", "variant": name, "error": repr(e)[-800:]}


def chunk_form_buffers(q, v):
    """``Qw, Kw, decay, A_qk, W, U`` as ``chunk_intra`` declares them (the variant writes W and U only,
    but its signature is the kernel's)."""
    import torch
    B, T, H, D = q.shape
    new = lambda shape, dt=q.dtype: torch.empty(shape, dtype=dt, device="cuda")
    return [new(q.shape), new(q.shape), new((B, H, -(-T // 64), D), torch.float32), new((B, T, H, 64)), new(q.shape),
            new(v.shape)]


def pipeline(q, k, v, g, beta, h0, final):
    """GDN by the variant, the cumsum and level 3's pass: ``o`` and the final state (or ``None``)."""
    import torch

    from kda import ops
    from kda.gated_delta import kernel_inputs
    from kda.kernels import level3
    from kda.kernels.build import compile_program
    B, T, H, D = q.shape
    q, k, g4 = kernel_inputs(q, k, g, False)
    intra = compile_program(variant().chunk_intra, (), **GDN)
    new = lambda shape, dt=q.dtype: torch.empty(shape, dtype=dt, device="cuda")
    W, U = new(k.shape), new(v.shape)
    unused = new((1, 1, 1, 1), torch.float32)
    flags = torch.zeros(2, dtype=torch.int32, device="cuda")
    intra(q, k, v, g4, beta, D ** -0.5, *chunk_form_buffers(q, v)[:4], W, U, flags,
          ops.stand_in(2, torch.int32, q.device))
    G = new((B, H, -(-T // 64) * 64), torch.float32)
    compile_program(level3.chunk_cumsum, (), D=1)(g4, G.view(*G.shape, 1), flags)
    states = h0 is not None
    pass_ = compile_program(level3.seq_in_loop_scalar, (), DK=D, DV=D, dtype="bfloat16", gate="per_token",
                            delta=True, slots=3, initial_state=states, final_state=states and final)
    o = new(v.shape)
    ht = new((B, H, D, D), torch.float32) if states and final else unused
    pass_(q, k, U, W, G, D ** -0.5, h0 if states else unused, o, ht)
    return o, (ht if states and final else None)


def part(name):
    import torch

    from kda.bench import median_ms, random_qkv
    from kda.gated_delta import chunk_gated_delta_rule, kernel_inputs, prepare_chunks
    from kda.kernels.build import compile_program
    from kda.metrics import rel_l2
    from kda.reference import level0 as ref0
    from kda.reference import level4 as ref4

    def inputs(B, T, H, seed):
        q, k, v = random_qkv(B, T, H, 128, 128, seed=seed)
        k = ref4.l2_normalize(k.float()).bfloat16()
        g = torch.nn.functional.logsigmoid(torch.randn(B, T, H, device="cuda"))
        return q, k, v, g, torch.rand(B, T, H, device="cuda")

    if name == "checks":
        for B, T, H in [(2, 1037, 4), (1, 449, 3), (1, 4096, 32)]:
            q, k, v, g, beta = inputs(B, T, H, seed=T)
            qq, kk, g4 = kernel_inputs(q, k, g, False)
            form = prepare_chunks(qq, kk, v, g4, beta, 128 ** -0.5)
            h0 = torch.randn(B, H, 128, 128, device="cuda")
            o, ht = pipeline(q, k, v, g, beta, h0, True)
            intra = compile_program(variant().chunk_intra, (), **GDN)
            Qw, Kw, decay, A_qk, W, U = chunk_form_buffers(qq, v)
            intra(qq, kk, v, g4, beta, 128 ** -0.5, Qw, Kw, decay, A_qk, W, U,
                  torch.zeros(2, dtype=torch.int32, device="cuda"), torch.empty(1, 1, dtype=torch.int32, device="cuda"))
            row = {"what": "check", "shape": [B, T, H, 128], "W_equal": bool(torch.equal(W, form.W)),
                   "U_equal": bool(torch.equal(U, form.U)), "nan": bool(o.isnan().any() or ht.isnan().any())}
            if T < 2000:
                ref_o, ref_ht = ref0.recurrent(q.double() * 128 ** -0.5, k, v, g, beta, h0, True)
                row.update(o_rel=rel_l2(o, ref_o), ht_rel=rel_l2(ht, ref_ht))
            log(RUN, row)
        return
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla_gdn
    B, T, H = {"time (1, 32768, 32)": (1, 32768, 32), "time (1, 8192, 96)": (1, 8192, 96)}[name]
    q, k, v, g, beta = inputs(B, T, H, seed=71)
    qq, kk, g4 = kernel_inputs(q, k, g, False)
    outs = chunk_form_buffers(qq, v)
    flags, no_table = torch.zeros(2, dtype=torch.int32, device="cuda"), torch.empty(1, 1, dtype=torch.int32,
                                                                                     device="cuda")
    from kda.kernels import level5
    record = compile_program(level5.chunk_intra, (), **GDN)
    wu_only = compile_program(variant().chunk_intra, (), **GDN)
    rows = {"chunk_intra of record": lambda: record(qq, kk, v, g4, beta, 128 ** -0.5, *outs, flags, no_table),
            "chunk_intra, W and U only": lambda: wu_only(qq, kk, v, g4, beta, 128 ** -0.5, *outs, flags, no_table),
            "pipeline: W and U only, cumsum, level 3's pass": lambda: pipeline(q, k, v, g, beta, None, False),
            "kda.chunk_gated_delta_rule, check_values=False":
                lambda: chunk_gated_delta_rule(q, k, v, g, beta, check_values=False),
            "fla (Triton)": lambda: fla_gdn(q, k, v, g, beta.bfloat16(), scale=128 ** -0.5)}
    try:
        import flash_qla
        rows["FlashQLA"] = lambda: flash_qla.chunk_gated_delta_rule(q, k, v, g, beta.bfloat16(), scale=128 ** -0.5)
    except ImportError:
        pass
    for label, fn in rows.items():
        log(RUN, {"what": "time", "shape": [B, T, H, 128], "stage": label, "ms": median_ms(fn)})


if __name__ == "__main__":
    if "compile" in sys.argv[1:]:
        compile_in_processes(RUN, 3, compile_one)
    each_in_process(RUN, ["checks", "time (1, 32768, 32)", "time (1, 8192, 96)"], part, limit_s=150)
