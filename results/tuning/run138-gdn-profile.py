"""Run 138 (prepared 2026-12-06): GDN's two kernels beside FlashQLA's for a profiler. After run 135 the compact
inverse takes 0.275 ms at (1, 32768, 32, 128) against ``kkt_solve``'s 0.230 and the op 0.886 against FlashQLA's 0.744;
the pass ran about 4.1 us a chunk against FlashQLA's 3.1 (run 118). Where its warps stall, against FlashQLA's
``fused_gdr_fwd``, is the next question. ``--impl kda`` runs ``kda.chunk_gated_delta_rule`` (at (1, 8192, 96, 128) it
takes the scalar-gate path unsplit: the inverse, then ``inverse_state_output_pass``), ``--impl flashqla`` FlashQLA's
forward (``auto_cp=False``: one pass over the whole sequence, as ours), each twice: once to compile, then the call
the profiler picks (ours: launches 3 and 4 are the second call's inverse and pass, both named main_kernel).

    ncu --clock-control none -k regex:main_kernel --launch-skip 3 --launch-count 1 --set full \
        python results/tuning/run138-gdn-profile.py --impl kda
    ncu --clock-control none -k regex:fused_chunk_gdr_fwd --launch-skip 1 --launch-count 1 --set full \
        python results/tuning/run138-gdn-profile.py --impl flashqla
"""
import argparse

import torch


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--impl", choices=("kda", "flashqla"), default="kda")
    parser.add_argument("--shape", default="1,8192,96,128")
    args = parser.parse_args()
    from kda.reference import level4 as ref4

    B, T, H, D = map(int, args.shape.split(","))
    gen = torch.Generator(device="cuda").manual_seed(7)
    draw = lambda *shape: torch.randn(*shape, generator=gen, device="cuda")
    q, k, v = draw(B, T, H, D).bfloat16(), ref4.l2_normalize(draw(B, T, H, D)).bfloat16(), draw(B, T, H, D).bfloat16()
    g = torch.nn.functional.logsigmoid(draw(B, T, H))
    beta = torch.rand(B, T, H, generator=gen, device="cuda")
    if args.impl == "kda":
        import kda
        run = lambda: kda.chunk_gated_delta_rule(q, k, v, g, beta)[0]
    else:
        import flash_qla
        run = lambda: flash_qla.chunk_gated_delta_rule(q, k, v, g, beta, scale=D ** -0.5, auto_cp=False)[0]
    for _ in range(2):
        o = run()
        torch.cuda.synchronize()
    print(args.impl, args.shape, "o finite:", bool(torch.isfinite(o).all()))


if __name__ == "__main__":
    main()
