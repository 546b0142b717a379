# snippet: cpu uses=snippets/level5/latency.py
"""Context parallel on paper for one sequence of 1,048,576 tokens (H = 32, D = 128, bf16): what each
rank sends and the expected time on 8 and 64 GPUs, from kda's recorded single-GPU KDA time and
stated link speeds. A model, not a measurement."""
from kda.distributed import map_bytes
from kda.site.runtime import recorded_data
from kda.tables import Table

record = next(r for r in recorded_data("snippets/level5/latency.py")["rows"] if r["op"] == "KDA")
T_REC, MS_REC = record["T"], record["kda"]                    # one H200, B = 1, H = 32, D = 128
T, H, K, V = 1 << 20, 32, 128, 128
forward_ms = lambda tokens: MS_REC * tokens / T_REC          # the forward is linear in T
LINKS = {8: ("NVLink, 450 GB/s per direction", 450e9), 64: ("400 Gb/s network per GPU, 50 GB/s", 50e9)}
FP32_FLOPS = 67e12                                            # the fold runs on the CUDA cores

maps = map_bytes(1, H, K, V, elem_bytes=4)                   # (M, B) in float32
print(f"One rank's map (M, B): B * H * (K^2 + K V) * 4 bytes = {maps / 2**20:.0f} MiB, independent of T.\n")
table = Table(["GPUs", "tokens per rank", "map + recompute (ms)", "sent per rank (MiB)", "link",
               "all-gather (ms)", "fold on the last rank (ms)", "total (ms)", "speed-up"],
              formats=[None, "{:,}", "{:.1f}", "{:,.0f}", None, "{:.2f}", "{:.2f}", "{:.1f}", "{:.1f}x"])
table.rows.append([1, T, forward_ms(T), 0, "-", 0.0, 0.0, forward_ms(T), 1.0])
for P, (link, speed) in LINKS.items():
    compute = 2 * forward_ms(T / P)                              # the map pass, then the recompute
    sent = (P - 1) * maps                                        # ring all-gather
    fold = (P - 1) * H * 2 * K * K * V / FP32_FLOPS * 1e3        # S <- M S + B, once per earlier rank
    total = compute + sent / speed * 1e3 + fold
    table.rows.append([P, T // P, compute, sent / 2**20, link, sent / speed * 1e3, fold, total,
                       forward_ms(T) / total])
print(table)
print(f"\nSingle-GPU time scaled from kda's chunk_kda record ({MS_REC:.2f} ms at T = {T_REC:,}). "
      "The map pass is counted as one more forward; message latency and overlap are left out.")
