# snippet: gpu
"""Backward errors on the H200: every gradient of kda's chunk_kda and chunk_gated_delta_rule (their
defaults: kda.backward with the kernels that are on) and of fla's same ops, against autograd through
the float64 token recurrence on the same rounded inputs. Loss sum(o * dO) + sum(S_T * dS_T); fresh
random inputs, 300 tokens (four chunks and a tail), 4 heads, d_k = d_v = 128, an initial state;
bf16 and fp16; gates logsigmoid(x), and the same with tokens 40 to 200 at -20; then packed
sequences of 0, 1, 100 and 199 tokens, each with its own state."""
import torch

import kda
from kda.metrics import rel_l2
from kda.reference import backward as ref
from kda.reference import level4 as ref4
from kda.site.runtime import save_data, text
from kda.tables import Table, sci
from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla_gdn
from fla.ops.kda import chunk_kda as fla_kda

T, H, D = 300, 4, 128
NAMES = "dq dk dv dg dbeta dh0".split()


def inputs(per_channel, dtype, gate, lengths=None, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    rand = lambda *shape: torch.randn(*shape, generator=gen, device="cuda")
    N, t = (1, T) if lengths is None else (len(lengths), sum(lengths))
    q, v = rand(1, t, H, D).to(dtype), rand(1, t, H, D).to(dtype)
    k = ref4.l2_normalize(rand(1, t, H, D)).to(dtype)
    g = torch.nn.functional.logsigmoid(rand(1, t, H, *([D] if per_channel else [])))
    if gate == "runs":
        g[:, 40:200] = -20.0
    beta = torch.rand(1, t, H, generator=gen, device="cuda").to(dtype)
    h0, dht = rand(N, H, D, D), rand(N, H, D, D)
    do = rand(1, t, H, D).to(dtype)
    return (q, k, v, g, beta, h0), do, dht


def gradients(fn, leaves, do, dht, **kwargs):
    leaves = [x.detach().clone().requires_grad_() for x in leaves]
    o, final = fn(*leaves[:5], scale=D ** -0.5, initial_state=leaves[5], output_final_state=True, **kwargs)
    torch.autograd.backward([o, final], [do, dht])
    return [x.grad for x in leaves]


table = Table([text(zh="实现", en="implementation"), text(zh="情形", en="case")] + NAMES,
              formats=[None, None] + [sci] * 6)
rows = []
OPS = [("KDA", True, kda.chunk_kda, fla_kda), ("GDN", False, kda.chunk_gated_delta_rule, fla_gdn)]
CASES = [(dtype, gate, None) for dtype in (torch.bfloat16, torch.float16) for gate in ("logsigmoid", "runs")]
CASES.append((torch.bfloat16, "runs", [0, 1, 100, 199]))
for op, per_channel, ours, theirs in OPS:
    for n, (dtype, gate, lengths) in enumerate(CASES):
        leaves, do, dht = inputs(per_channel, dtype, gate, lengths, seed=n)
        kwargs = {}
        case = f"{str(dtype)[6:]}, {'-20' if gate == 'runs' else 'logsigmoid'}"
        if lengths is not None:
            cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], device="cuda", dtype=torch.int32)
            kwargs, case = {"cu_seqlens": cu}, case + text(zh="，打包 0/1/100/199", en=", packed 0/1/100/199")
            want = ref.packed_backward(*(x.double().cpu() for x in (*leaves[:5], do)), cu.cpu(), dht.double().cpu(),
                                       D ** -0.5, initial_state=leaves[5].double().cpu())
        else:
            want = ref.recurrence_backward(*(x.double().cpu() for x in leaves[:5]), do.double().cpu(),
                                           dht.double().cpu(), D ** -0.5, leaves[5].double().cpu())
        for impl, fn in ((f"kda {op}", ours), (f"fla {op}", theirs)):
            try:
                got = gradients(fn, leaves, do, dht, **kwargs)
            except Exception as e:                     # a case fla does not take is shown, not fatal
                print(f"{impl}, {case}: {type(e).__name__}: {str(e)[:120]}")
                continue
            errs = [rel_l2(a.double().cpu(), b) if torch.isfinite(a).all() else float("nan")
                    for a, b in zip(got, want)]
            table.rows.append([impl, case] + errs)
            rows.append({"impl": impl, "dtype": str(dtype)[6:], "gate": gate, "lengths": lengths,
                         **dict(zip(NAMES, errs))})
print(text(zh="与经过 float64 逐 token 递推的 autograd 之间的相对 L2 误差（nan 表示出现了非有限值）：",
           en="Relative L2 error against autograd through the float64 token recurrence (nan: a value "
              "was not finite):") + "\n")
print(table)
assert all(r[k] == r[k] for r in rows if r["impl"].startswith("kda") for k in NAMES), "a kda gradient is NaN"
save_data({"rows": rows})
