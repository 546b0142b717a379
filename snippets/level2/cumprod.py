# snippet: cpu
"""The cumulative product gamma_j = a_1 ... a_j computed directly underflows; the log-domain sum
log gamma_j = sum log a_i does not. Per-step decays drawn from U(0.5, 0.9)."""
import torch

from kda.site.runtime import text
from kda.tables import Table, sci

gen = torch.Generator().manual_seed(0)
table = Table(["dtype", text(zh="长度", en="length"),
               text(zh="最小 gamma，直接 cumprod", en="smallest gamma, direct cumprod"),
               text(zh="为 0 的项数", en="entries that are 0"), text(zh="非正规数项数", en="subnormal entries"),
               text(zh="最小 log gamma，log 域", en="smallest log gamma, log domain")],
              formats=[None, None, sci, None, None, "{:.1f}"])
for dtype, length in [(torch.float16, 64), (torch.float16, 128), (torch.float32, 128), (torch.float32, 512)]:
    a = (0.5 + 0.4 * torch.rand(length, generator=gen, dtype=torch.float64)).to(dtype)
    direct = torch.cumprod(a, 0)
    tiny = torch.finfo(dtype).tiny
    log_gamma = torch.cumsum(torch.log(a.double()), 0)
    table.rows.append([str(dtype).removeprefix("torch."), length, direct.min().item(), int((direct == 0).sum()),
                       int(((direct > 0) & (direct < tiny)).sum()), log_gamma.min().item()])
print(table)
