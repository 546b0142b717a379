# snippet: cpu uses=snippets/level5/latency.py uses=snippets/cp/split_latency.py
"""Context parallel on paper for one sequence of 1,048,576 tokens (H = 32, D = 128, bf16): what each
rank sends and the expected time on 8 and 64 GPUs, from kda's recorded single-GPU stage times, the
recorded cost of a fold step and stated link speeds. A model, not a measurement."""
from kda.distributed import map_bytes
from kda.site.runtime import recorded_data, text
from kda.tables import Table

level5 = recorded_data("snippets/level5/latency.py")
record = next(r for r in level5["rows"] if (r["op"], r["B"], r["H"]) == ("KDA", 1, 32))
T_REC, MS_REC = record["T"], level5["total_ms"]              # one H200, B = 1, H = 32, D = 128
stage = {s["stage"]: s["ms"] for s in level5["stages"]}
prepare = stage["chunk_intra"]
state_pass = stage["gated_state_output_pass"]
rest = stage["the rest"]                      # host work and the checks of g and beta, outside the stages
split = recorded_data("snippets/cp/split_latency.py")
fold_stage = next(s["ms"] for s in split["stages"] if s["stage"] == "fold")
fold_step = fold_stage / (split["rows"][0]["pieces"] - 1)     # one S <- M S + B, launch-bound

T, H, K, V = 1 << 20, 32, 128, 128
scaled = lambda ms, tokens: ms * tokens / T_REC               # every stage is linear in T
LINKS = {8: (text(zh="NVLink，每个方向 450 GB/s", en="NVLink, 450 GB/s per direction"), 450e9),
         64: (text(zh="每张 GPU 400 Gb/s 网络，50 GB/s", en="400 Gb/s network per GPU, 50 GB/s"), 50e9)}

maps = map_bytes(1, H, K, V, elem_bytes=4)                   # (M, B) in float32
print(text(zh=f"一个 rank 的映射 (M, B)：B * H * (K^2 + K V) * 4 字节 = {maps / 2**20:.0f} MiB，与 T 无关。",
           en=f"One rank's map (M, B): B * H * (K^2 + K V) * 4 bytes = {maps / 2**20:.0f} MiB, independent of T.")
      + "\n")
table = Table([text(zh="GPU 数", en="GPUs"), text(zh="每个 rank 的 token 数", en="tokens per rank"),
               text(zh="准备 + 3 趟传递 + 其余（ms）", en="prepare + 3 passes + rest (ms)"),
               text(zh="每个 rank 发送量（MiB）", en="sent per rank (MiB)"), text(zh="链路", en="link"),
               text(zh="all-gather（ms）", en="all-gather (ms)"),
               text(zh="最后一个 rank 上的折叠（ms）", en="fold on the last rank (ms)"),
               text(zh="合计（ms）", en="total (ms)"), text(zh="加速比", en="speed-up")],
              formats=[None, "{:,}", "{:.1f}", "{:,.0f}", None, "{:.2f}", "{:.2f}", "{:.1f}", "{:.1f}x"])
table.rows.append([1, T, scaled(MS_REC, T), 0, "-", 0.0, 0.0, scaled(MS_REC, T), 1.0])
for P, (link, speed) in LINKS.items():
    # the chunk form is prepared once; the state pass runs three times: B, M and the recompute
    compute = scaled(prepare + 3 * state_pass + rest, T / P)
    sent = (P - 1) * maps                                        # ring all-gather
    fold = (P - 1) * fold_step                                   # once per earlier rank
    total = compute + sent / speed * 1e3 + fold
    table.rows.append([P, T // P, compute, sent / 2**20, link, sent / speed * 1e3, fold, total,
                       scaled(MS_REC, T) / total])
print(table)
print("\n" + text(
    zh=f"单 GPU：kda 的 chunk_kda 记录（T = {T_REC:,} 时 {MS_REC:.2f} ms）按 T 换算；"
       f"每个 rank：各阶段（T = {T_REC:,} "
       f"时准备 {prepare:.2f} ms、状态传递 {state_pass:.2f} ms、调用的其余部分 {rest:.2f} ms）按本段长度换算；"
       f"一步折叠 {fold_step * 1e3:.0f} us，取卡内切分在 H = 4 时的记录（受启动开销限制：H = 32 时它的算术量仍远小于"
       "启动开销）。消息延迟与计算和通信的重叠未计入。",
    en=f"Single GPU: kda's chunk_kda record ({MS_REC:.2f} ms at T = {T_REC:,}) scaled to T; per rank: its "
       f"stages (prepare {prepare:.2f} ms, state pass {state_pass:.2f} ms, the rest of the call {rest:.2f} ms at "
       f"T = {T_REC:,}) scaled to the slice; a fold step {fold_step * 1e3:.0f} us as recorded for the intra-card "
       "split at H = 4 (launch-bound: at H = 32 its arithmetic is still far below the launch cost). "
       "Message latency and overlap are left out."))
