"""Run 91 (H200, prepared 2026-12-03, not yet run): the training check of issue 18. A small language
model with KDA layers (``kda.layer.KimiDeltaAttention``: raw gates, ``A_log``/``dt_bias``, beta logits and
the L2 norm of q, k inside the op, as a model calls it) trained twice from the same seed on the same
bytes (this repository's English pages), the op once by kda (``chunk_kda`` with its CUDA backward,
``kda.backward``) and once by fla's ``chunk_kda``; everything else is the same module. The two loss
curves must agree to bf16's noise. One row per logged step in ``$OUT/run91.jsonl``.

    FLA_FLASH_QLA=0 python results/tuning/run91-train.py [steps] [device] [backend ...]
"""
import glob
import os
import sys
import time

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import log  # noqa: E402

RUN = "run91"
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
VOCAB, HIDDEN, HEADS, HEAD_DIM, LAYERS = 256, 256, 4, 64, 2
SEQ, BATCH, LR = 512, 8, 1e-3


class Block(nn.Module):
    def __init__(self):
        from kda.layer import KimiDeltaAttention

        super().__init__()
        self.norm1, self.norm2 = nn.RMSNorm(HIDDEN), nn.RMSNorm(HIDDEN)
        self.attn = KimiDeltaAttention(HIDDEN, HEADS, HEAD_DIM)
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


def corpus(device):
    text = b"".join(open(p, "rb").read() for p in sorted(glob.glob(os.path.join(ROOT, "docs", "en", "*.md"))))
    return torch.frombuffer(bytearray(text), dtype=torch.uint8).to(device=device, dtype=torch.long)


def train(backend, steps, device):
    import kda.layer
    from kda import cuda_autograd

    cuda_autograd.DEVICE_BACKWARD = True
    if backend == "fla":
        from fla.ops.kda import chunk_kda as fla_kda
        kda.layer.chunk_kda = lambda q, k, v, g, beta, **kw: fla_kda(q, k, v, g, beta, **kw)
    else:
        from kda.gated_delta import chunk_kda
        kda.layer.chunk_kda = chunk_kda
    torch.manual_seed(0)
    model = TinyLM().to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    data = corpus(device)
    gen = torch.Generator(device="cpu").manual_seed(1)
    start = time.time()
    for step in range(steps):
        at = torch.randint(0, len(data) - SEQ - 1, (BATCH,), generator=gen)
        window = torch.stack([data[i:i + SEQ + 1] for i in at.tolist()])
        with torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16):
            logits = model(window[:, :-1])
        loss = nn.functional.cross_entropy(logits.float().reshape(-1, VOCAB), window[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step % 10 == 0 or step == steps - 1:
            log(RUN, {"what": "train", "backend": backend, "step": step, "loss": round(loss.item(), 4),
                      "s": round(time.time() - start, 1)})


if __name__ == "__main__":
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 300
    device = sys.argv[2] if len(sys.argv) > 2 else "cuda"
    backends = sys.argv[3:] or (("kda",) if device == "cpu" else ("kda", "fla"))
    for backend in backends:
        train(backend, steps, device)
