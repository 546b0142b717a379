# snippet: gpu
"""The training check on the H200: a small byte-level language model with two KDA layers
(kda.layer.KimiDeltaAttention: raw gates, A_log and dt_bias, beta's sigmoid and the L2 norm of q and
k inside the op, as a model calls it) trained 300 steps twice from one seed on the same bytes (this
site's English pages), the op once by kda's chunk_kda (its CUDA backward, kda.backward) and once by
fla's chunk_kda; everything else is the same module. bf16 autocast, AdamW."""
import glob
import time

import torch
from torch import nn

import kda.layer
from kda.gated_delta import chunk_kda
from kda.site.runtime import save_data, text
from kda.tables import Table
from fla.ops.kda import chunk_kda as fla_kda

VOCAB, HIDDEN, HEADS, HEAD_DIM, LAYERS = 256, 256, 4, 64, 2
SEQ, BATCH, LR, STEPS = 512, 8, 1e-3, 300


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm1, self.norm2 = nn.RMSNorm(HIDDEN), nn.RMSNorm(HIDDEN)
        self.attn = kda.layer.KimiDeltaAttention(HIDDEN, HEADS, HEAD_DIM)
        self.mlp = nn.Sequential(nn.Linear(HIDDEN, 4 * HIDDEN), nn.GELU(), nn.Linear(4 * HIDDEN, HIDDEN))

    def forward(self, x):
        x = x + self.attn(self.norm1(x))[0]
        return x + self.mlp(self.norm2(x))


class TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, HIDDEN)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.norm, self.head = nn.RMSNorm(HIDDEN), nn.Linear(HIDDEN, VOCAB, bias=False)

    def forward(self, tokens):
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


text_bytes = b"".join(open(p, "rb").read() for p in sorted(glob.glob("docs/en/*.md")))
data = torch.frombuffer(bytearray(text_bytes), dtype=torch.uint8).to("cuda", torch.long)


def train(op):
    kda.layer.chunk_kda = op                          # the layer's op: everything else is the same module
    torch.manual_seed(0)
    model = TinyLM().cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    gen = torch.Generator().manual_seed(1)
    losses, start = [], time.time()
    for _ in range(STEPS):
        at = torch.randint(0, len(data) - SEQ - 1, (BATCH,), generator=gen).tolist()
        window = torch.stack([data[i:i + SEQ + 1] for i in at])
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(window[:, :-1])
        loss = nn.functional.cross_entropy(logits.float().reshape(-1, VOCAB), window[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, time.time() - start


try:
    curves = {"kda": train(chunk_kda), "fla": train(lambda q, k, v, g, beta, **kw: fla_kda(q, k, v, g, beta, **kw))}
finally:
    kda.layer.chunk_kda = chunk_kda
gap = [abs(a - b) for a, b in zip(curves["kda"][0], curves["fla"][0])]
table = Table([text(zh="步", en="step"), text(zh="损失，kda", en="loss, kda"), text(zh="损失，fla", en="loss, fla")],
              formats=[None, "{:.3f}", "{:.3f}"])
for step in (0, 50, 100, 150, 200, 250, STEPS - 1):
    table.rows.append([step, curves["kda"][0][step], curves["fla"][0][step]])
print(table)
print(text(zh=f"\n{STEPS} 步中损失之差：平均 {sum(gap) / len(gap):.4f}，最大 {max(gap):.4f}。",
           en=f"\nThe losses differ by {sum(gap) / len(gap):.4f} on average over the {STEPS} steps, "
              f"{max(gap):.4f} at most."))
save_data({"steps": STEPS, "loss": {name: losses for name, (losses, _) in curves.items()},
           "seconds": {name: seconds for name, (_, seconds) in curves.items()}})
