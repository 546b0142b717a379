# snippet: cpu
"""A verify step of speculative decoding (fla's num_accepted_tokens) on the CPU: three sequences propose 4, 2
and 3 tokens; each token's state goes to its own pool slot; the next step resumes each sequence from the slot of
the last token its sampler kept. Checked against the float64 recurrence over the kept tokens alone."""
import torch

import kda
from kda.metrics import rel_l2
from kda.reference import level0 as ref0
from kda.site.runtime import text
from kda.tables import Table

H, K, V, P = 2, 16, 16, 32
torch.manual_seed(0)
unit = lambda x: x / x.norm(dim=-1, keepdim=True)


def tokens(n):
    """q, k, v, g, beta of n tokens of one packed row."""
    return (torch.randn(1, n, H, K), unit(torch.randn(1, n, H, K)), torch.randn(1, n, H, V),
            torch.nn.functional.logsigmoid(torch.randn(1, n, H, K)), torch.rand(1, n, H))


pool = torch.zeros(P, H, K, V)
drafted, kept = [4, 2, 3], [2, 2, 1]                 # tokens proposed in step 1, and how many the sampler kept
step1 = tokens(sum(drafted))
cu = torch.tensor([0, 4, 6, 9])
slots1 = torch.tensor([[0, 1, 2, 3], [4, 5, -1, -1], [6, 7, 8, -1]])     # -1: no token there
kda.fused_recurrent_kda(*step1, initial_state=pool, cu_seqlens=cu, ssm_state_indices=slots1)
step2 = tokens(6)                                      # step 2: two new tokens per sequence
slots2 = torch.tensor([[9, 10, 0, 1], [11, 12, 4, 5], [13, 14, 6, -1]])
o2, _ = kda.fused_recurrent_kda(*step2, initial_state=pool, cu_seqlens=torch.tensor([0, 2, 4, 6]),
                                ssm_state_indices=slots2, num_accepted_tokens=torch.tensor([4, 4, 3]))
table = Table([text(zh="序列", en="sequence"), text(zh="第 1 步保留的 token", en="tokens kept from step 1"),
               text(zh="读入的槽位", en="slot read"), text(zh="输出的相对 L2 误差", en="output rel. L2 error"),
               text(zh="最终状态的相对 L2 误差", en="final state rel. L2 error")],
              formats=[None, None, None, "{:.1e}", "{:.1e}"])
for n in range(3):
    s1, s2 = cu[n].item(), 2 * n
    ours = [torch.cat([x[:, s1:s1 + kept[n]], y[:, s2:s2 + 2]], dim=1) for x, y in zip(step1, step2)]
    ours[0] = ours[0].double() * K ** -0.5
    ref_o, ref_state = ref0.recurrent(*ours, None, True)
    table.rows.append([n, kept[n], slots2[n, [4, 4, 3][n] - 1].item(), rel_l2(o2[:, s2:s2 + 2], ref_o[:, -2:]),
                       rel_l2(pool[slots2[n, 1]][None], ref_state)])
print(table)
