# snippet: cpu
"""kda.backward, the backward that CUDA runs, here on the CPU in float32 (its dtype on the GPU) and in
float64, against autograd through the float64 token recurrence: the inputs of agreement.py's KDA and
GDN rows, the L2 norm of q and k in the op, grouped value heads (2 key heads for 4 value heads) and
four packed sequences (0, 1, 90 and 109 tokens), each with its initial state."""
import torch

from kda import backward
from kda.metrics import rel_l2
from kda.reference import backward as bwd
from kda.reference import level4 as ref4
from kda.site.runtime import text
from kda.tables import Table, sci

B, T, H, K, V, scale = 2, 100, 4, 16, 8, 0.25
gen = torch.Generator().manual_seed(0)
rand = lambda *shape: torch.randn(*shape, generator=gen, dtype=torch.float64)
q, v, h0, dO, dS = rand(B, T, H, K), rand(B, T, H, V), rand(B, H, K, V), rand(B, T, H, V), rand(B, H, K, V)
k = ref4.l2_normalize(rand(B, T, H, K))
beta = torch.rand(B, T, H, generator=gen, dtype=torch.float64)
strong = torch.nn.functional.logsigmoid(rand(B, T, H, K))
strong[:, 20:90] = -20.0
gates = {"GDN": torch.nn.functional.logsigmoid(rand(B, T, H)), "KDA": torch.nn.functional.logsigmoid(rand(B, T, H, K)),
         text(zh="KDA，连续取 -20", en="KDA, runs of -20"): strong}


def autograd_of_the_recurrence(q, k, v, g, beta, h0, dO, dS, cu=None, l2norm=False, group=1):
    """What every row must equal: the op's arguments through l2norm, grouped heads and the
    recurrence (sequence by sequence), differentiated by autograd."""
    leaves = [x.clone().requires_grad_() for x in (q, k, v, g, beta, h0)]
    qn, kn = (ref4.l2_normalize(x) if l2norm else x for x in leaves[:2])
    qn, kn = qn.repeat_interleave(group, 2), kn.repeat_interleave(group, 2)
    bounds = [0, q.shape[1]] if cu is None else cu
    loss = 0
    for n, (s, e) in enumerate(zip(bounds[:-1], bounds[1:])):
        rows = slice(None) if cu is None else slice(n, n + 1)
        o, S = bwd.level0.recurrent(qn[:, s:e] * scale, kn[:, s:e], leaves[2][:, s:e], leaves[3][:, s:e],
                                    leaves[4][:, s:e], leaves[5][rows], True)
        loss = loss + (o * dO[:, s:e]).sum() + (S * dS[rows]).sum()
    return torch.autograd.grad(loss, leaves)


table = Table([text(zh="情形", en="case"), "dtype", "dq", "dk", "dv", "dg", "dbeta", "dh0"],
              formats=[None, None] + [sci] * 6)
cases = [(name, g, dict()) for name, g in gates.items()]
cases.append((text(zh="KDA，op 内做 L2 归一化", en="KDA, L2 norm in the op"), gates["KDA"], dict(l2norm=True)))
cases.append((text(zh="GDN，分组 value 头 2 / 4", en="GDN, grouped value heads 2 / 4"), gates["GDN"],
              dict(group=2)))
cases.append((text(zh="KDA，4 条打包序列", en="KDA, 4 packed sequences"), gates["KDA"],
              dict(cu=[0, 0, 1, 91, 200])))
for name, g, how in cases:
    qq, kk, gg, bb, vv, hh, oo, ss = q * 3, k * 2, g, beta, v, h0, dO, dS   # keys not unit: the norm has work
    if how.get("group"):
        qq, kk = qq[:, :, ::2], kk[:, :, ::2]
    if how.get("cu"):                                    # one batch row of 200 tokens, one state per sequence
        flat = lambda x: x.transpose(0, 1).reshape(1, B * T, *x.shape[2:])[:, :200]
        qq, kk, vv, gg, bb, oo = (flat(x) for x in (qq, kk, vv, gg, bb, oo))
        hh, ss = torch.cat([h0, h0]), torch.cat([dS, dS])
    want = autograd_of_the_recurrence(qq, kk, vv, gg, bb, hh, oo, ss, how.get("cu"), how.get("l2norm", False),
                                      how.get("group", 1))
    cu = torch.tensor(how["cu"]) if how.get("cu") else None
    for dtype in (torch.float32, torch.float64):
        ours = backward.op_gradients(*(x.to(dtype) for x in (qq, kk, vv, gg, bb)), scale, hh.to(dtype),
                                     how.get("l2norm", False), cu, oo.to(dtype), ss.to(dtype), dtype=dtype)
        table.rows.append([name, str(dtype).removeprefix("torch.")] + [rel_l2(a, w) for a, w in zip(ours, want)])
print(text(zh="kda.backward 与经过逐 token 递推的 autograd 之间的相对 L2 差：",
           en="Relative L2 difference of kda.backward from autograd through the token recurrence:") + "\n")
print(table)
