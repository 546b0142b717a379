"""CUDA paths that land before their GPU tests have passed.

Kernel work reaches ``main`` once a machine without a GPU has checked what it can (sm_90a
compiles, launch tests, float64 stage references). Until its GPU tests pass on the H200, such a
path stays off: a module-level switch next to its code, ``False`` by default, listed here and on
the API page ("not yet run on a GPU"). The commit that adds the path's GPU test log under
``results/`` names the log here and turns the switch on, unless the measurements say the path it
would replace is faster or it has not been timed yet (then it stays off, listed apart);
``tests/test_cuda_paths.py`` holds every switch that is on by default to a log that exists.

A call that would need a path that is off raises through ``require`` with a message that says
which switch and why, instead of computing on an unchecked kernel.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass


@dataclass(frozen=True)
class CudaPath:
    name: str                 # what the path does, e.g. "gdn_scalar_gate_forward"
    module: str               # the module that holds the switch, next to the code it guards
    switch: str               # the module-level bool
    what: dict                # {"en": ..., "zh": ...}: one line for the API page
    gpu_log: str | None = None  # results/... : the log of the GPU tests it passed


# Every CUDA path that landed before its GPU tests, with its switch; a path whose GPU tests have passed
# names their log (and may still be off by default where it is slower than the path it would replace).
PATHS: tuple[CudaPath, ...] = (
    CudaPath(
        name="gdn_scalar_gate",
        module="kda.gated_delta",
        switch="SCALAR_GATE_PATH",
        what={"en": "chunk_gated_delta_rule by kda/kernels/scalar_gate.py (the gated inverse, then a pass that "
                    "forms K S and Q K^T itself) where its blocks fill at least 0.4 of the SMs",
              "zh": "chunk_gated_delta_rule 经由 kda/kernels/scalar_gate.py（先求带门控的逆矩阵，再由一趟顺序遍历"
                    "自行计算 K S 与 Q K^T），用于其 block 至少占满 0.4 的 SM 的形状"},
        gpu_log="results/tuning/run90/gpu-tests.txt",
    ),
    CudaPath(
        name="chunk_backward",
        module="kda.cuda_autograd",
        switch="DEVICE_BACKWARD",
        what={"en": "gradients of chunk_kda and chunk_gated_delta_rule on CUDA by kda/backward.py (the backward's "
                    "three stages in float32 torch operations; no TileLang kernels yet)",
              "zh": "chunk_kda 与 chunk_gated_delta_rule 在 CUDA 上的梯度，由 kda/backward.py 计算（反向的三个阶段，"
                    "用 float32 的 torch 运算；还没有 TileLang kernel）"},
        gpu_log="results/tuning/run91/gpu-tests.txt",
    ),
    CudaPath(
        name="backward_state_kernels",
        module="kda.backward",
        switch="STATE_KERNELS",
        what={"en": "the backward's two sequential passes by kda/kernels/backward_states.py, one launch each "
                    "(dense batches), instead of torch launches per chunk",
              "zh": "反向的两趟顺序遍历由 kda/kernels/backward_states.py 完成，每趟一次启动（非打包的批），"
                    "取代每个块若干次 torch 启动"},
        gpu_log="results/tuning/run91/gpu-tests.txt",
    ),
    CudaPath(
        name="backward_forward_pieces",
        module="kda.backward",
        switch="FORWARD_PIECES",
        what={"en": "what the backward's state passes read (W, U, the gated q and k, the scores) made by the "
                    "forward's chunk_intra kernel in one launch, instead of torch stages by groups of chunks",
              "zh": "反向的状态遍历所读的量（W、U、带门控的 q 与 k、得分）由前向的 chunk_intra kernel 一次启动算出，"
                    "取代按块分组的 torch 阶段"},
        gpu_log="results/tuning/run93/gpu-tests-backward.txt",
    ),
    CudaPath(
        name="backward_chunk_kernel",
        module="kda.backward",
        switch="CHUNK_KERNEL",
        what={"en": "the backward's chunk stage for a gate per head (chunk_gated_delta_rule) by "
                    "kda/kernels/backward_chunks.py, one launch for every chunk, instead of torch stages by "
                    "groups of chunks",
              "zh": "反向的块内阶段（每个头一个门控，即 chunk_gated_delta_rule）由 kda/kernels/backward_chunks.py "
                    "完成，一次启动处理所有块，取代按块分组的 torch 阶段"},
        gpu_log="results/tuning/run93/gpu-tests-backward.txt",
    ),
    CudaPath(
        name="backward_chunk_kernels_by_channel",
        module="kda.backward",
        switch="CHUNK_KERNELS_BY_CHANNEL",
        what={"en": "the backward's chunk stage for a gate per channel (chunk_kda) by the three kernels of "
                    "kda/kernels/backward_chunks.py that split it (the pairs' pieces, the terms with the states, "
                    "the pair sums by sub-chunks), instead of torch stages by groups of chunks",
              "zh": "逐通道门控（chunk_kda）时反向的块内阶段，由 kda/kernels/backward_chunks.py 中拆分它的三个 kernel "
                    "完成（成对的中间量、与状态有关的各项、按子块的成对求和），取代按块分组的 torch 阶段"},
        gpu_log="results/tuning/run97/gpu-tests-backward.txt",
    ),
    CudaPath(
        name="level_backward",
        module="kda.cuda_autograd",
        switch="LEVEL_BACKWARD",
        what={"en": "gradients of linear_attention, decay_attention, gated_attention and delta_rule on CUDA: their "
                    "kernels' forward, then kda/backward.py's stages with no gate or no delta rule (the delta rule "
                    "through the backward kernels of a gate per head, with a zero gate; levels 1-3 through the chunk "
                    "kernels compiled without the delta rule)",
              "zh": "linear_attention、decay_attention、gated_attention 与 delta_rule 在 CUDA 上的梯度：前向用各自的 "
                    "kernel，反向用 kda/backward.py 中不带门控或不带 delta 规则的同一套阶段（delta 规则以零门控走"
                    "每个头一个门控的反向 kernel；第一至三级走以不带 delta 规则编译的块内 kernel）"},
        gpu_log="results/tuning/run98/gpu-tests-level-backward.txt",
    ),
    CudaPath(
        name="states_as_operands",
        module="kda.backward",
        switch="STATES_AS_OPERANDS",
        what={"en": "the backward's state-pass kernels writing both states in the inputs' dtype, as the chunk "
                    "kernels read them, and the reverse pass each chunk decay's gate term from its float32 "
                    "registers, instead of float32 states in HBM, rounding copies and an einsum over them",
              "zh": "反向的状态遍历 kernel 直接以输入的 dtype 写出两个状态（正是块内 kernel 读取的形式），并由反向"
                    "遍历从其 float32 寄存器中算出每块衰减的门控梯度项，取代 HBM 中的 float32 状态、对它们的舍入"
                    "拷贝和 einsum"},
        gpu_log="results/tuning/run100/gpu-tests-switches.txt",
    ),
    CudaPath(
        name="shared_pair_sums",
        module="kda.backward",
        switch="SHARED_PAIR_SUMS",
        what={"en": "KDA's chunk_pair_gradients with its two row sums against K sharing each pair's decay and "
                    "each reference row's scaled K, and its two column sums made one (about half the "
                    "exponentials and shared loads of the pairs inside a sub-chunk)",
              "zh": "KDA 的 chunk_pair_gradients：两个对 K 的行和共用每对的衰减与每个参考行缩放后的 K，两个列和"
                    "合成一个（子块内成对计算的指数与共享内存读取约减半）"},
        gpu_log="results/tuning/run100/gpu-tests-switches.txt",
    ),
    CudaPath(
        name="gate_in_pair_kernel",
        module="kda.backward",
        switch="GATE_IN_PAIR_KERNEL",
        what={"en": "KDA's chunk_pair_gradients writing the gate's gradient itself (the chunk decay's term, the "
                    "reverse sum over the chunk, to_end's exclusive prefix sum), instead of gate_gradient's "
                    "torch passes over [B, T, H, DK] float32 tensors",
              "zh": "KDA 的 chunk_pair_gradients 直接写出门控的梯度（块衰减项、块内的反向求和、to_end 的排他前缀和），"
                    "取代 gate_gradient 在 [B, T, H, DK] float32 张量上的多趟 torch 运算"},
        gpu_log="results/tuning/run100/gpu-tests-switches.txt",
    ),
    CudaPath(
        name="token_major_states",
        module="kda.backward",
        switch="TOKEN_MAJOR_STATES",
        what={"en": "the backward's state-pass kernels reading the forward's pieces and dO token-major, [B, T, H, D], "
                    "as chunk_intra writes them, instead of copies padded and laid out by chunks",
              "zh": "反向的状态遍历 kernel 按 token 优先的 [B, T, H, D] 布局直接读取前向的中间量与 dO（正是 chunk_intra "
                    "写出的布局），取代补齐后按块重排的拷贝"},
        gpu_log="results/tuning/run100/gpu-tests-switches.txt",
    ),
    CudaPath(
        name="level_pieces",
        module="kda.backward",
        switch="LEVEL_PIECES",
        what={"en": "the state passes' pieces of levels 1-3 with a gate per head or none made by level_pieces in the "
                    "inputs' dtype and token-major (a cumulative gate per head, one batched GEMM for the scores), "
                    "instead of float32 torch stages by groups of chunks",
              "zh": "第一至三级（每个头一个门控或没有门控）状态遍历所读的中间量由 level_pieces 以输入的 dtype、"
                    "按 token 优先的布局算出（每个头的累积门控，一次批量 GEMM 算得分），取代按块分组的 float32 "
                    "torch 阶段"},
        gpu_log="results/tuning/run103/gpu-tests-switches.txt",
    ),
    CudaPath(
        name="pair_kernel_two_blocks",
        module="kda.backward",
        switch="PAIR_KERNEL_TWO_BLOCKS",
        what={"en": "KDA's chunk_pair_gradients compiled for two blocks per SM (128 registers, some spilled) "
                    "instead of one block of 8 warps at 255 registers",
              "zh": "KDA 的 chunk_pair_gradients 以每个 SM 两个 block 编译（128 个寄存器，部分溢出），"
                    "取代每个 SM 一个 8 warp、255 个寄存器的 block"},
        gpu_log="results/tuning/run103/gpu-tests-switches.txt",
    ),
    CudaPath(
        name="pair_kernel_by_channels",
        module="kda.backward",
        switch="PAIR_KERNEL_BY_CHANNELS",
        what={"en": "KDA's chunk_pair_gradients split by channels (kda.backward.PAIR_KERNEL_CHANNELS per block: "
                    "smaller tiles, more blocks per SM) instead of one block for all 128 channels of a chunk",
              "zh": "KDA 的 chunk_pair_gradients 按通道拆分（每个 block 处理 kda.backward.PAIR_KERNEL_CHANNELS "
                    "个通道：块更小，每个 SM 可驻留更多 block），取代一个 block 处理一块的全部 128 个通道"},
        gpu_log="results/tuning/run103/gpu-tests-switches.txt",
    ),
    CudaPath(
        name="grads_in_input_dtype",
        module="kda.backward",
        switch="GRADS_IN_INPUT_DTYPE",
        what={"en": "the chunk kernel of a gate per head writing dq, dk and dv in the inputs' dtype (KDA's "
                    "chunk_state_gradients its dv), where no L2 norm and no grouped value heads follow, instead of "
                    "float32 tensors rounded by a copy each",
              "zh": "每个头一个门控的块内 kernel 直接以输入的 dtype 写出 dq、dk、dv（KDA 的 chunk_state_gradients 写出 dv；"
                    "其后没有 L2 归一化、也没有分组值头时），取代先写 float32 张量、再各拷贝一次舍入"},
        gpu_log="results/tuning/run103/gpu-tests-switches.txt",
    ),
    CudaPath(
        name="scores_from_forward",
        module="kda.backward",
        switch="SCORES_FROM_FORWARD",
        what={"en": "KDA's chunk kernels reading the scores P from the forward's chunk_intra (its A_qk, made for the "
                    "state passes already) and chunk_pair_pieces compiled without them, instead of making them "
                    "a second time pair by pair",
              "zh": "KDA 的块内 kernel 直接读取前向 chunk_intra 算出的得分 P（即其 A_qk，本已为状态遍历算好），"
                    "chunk_pair_pieces 以不含得分的方式编译，不再逐对重算一遍"},
        gpu_log="results/tuning/run103/gpu-tests-switches.txt",
    ),
    CudaPath(
        name="pair_pieces_from_forward",
        module="kda.backward",
        switch="PAIR_PIECES_FROM_FORWARD",
        what={"en": "KDA's chunk kernels reading all they need of the pairs (the cumulative gate, the inverse T, "
                    "stril(K K^T E) and the scores) from the forward's chunk_intra, compiled to write them in the "
                    "launch that makes the state passes' pieces, so that chunk_pair_pieces does not run",
              "zh": "KDA 的块内 kernel 所需的成对中间量（累积门控、逆矩阵 T、stril(K K^T E) 与得分）全部取自前向的 "
                    "chunk_intra：它在为状态遍历生成中间量的那次启动里一并写出这些量，于是 chunk_pair_pieces 不再运行"},
        gpu_log="results/tuning/run103/gpu-tests-switches.txt",
    ),
    CudaPath(
        name="inverse_from_forward",
        module="kda.backward",
        switch="INVERSE_FROM_FORWARD",
        what={"en": "GDN's chunk kernel reading the inverse T, stril(K K^T E) and the scores from the forward's "
                    "chunk_intra (written in the launch that makes the state passes' pieces) instead of making them "
                    "again: no solve, no K K^T and Q K^T GEMMs",
              "zh": "GDN 的块内 kernel 直接读取前向 chunk_intra 写出的逆矩阵 T、stril(K K^T E) 与得分（在为状态遍历"
                    "生成中间量的那次启动里写出），不再重算：没有求逆，也没有 K K^T 与 Q K^T 两个 GEMM"},
        gpu_log="results/tuning/run103/gpu-tests-switches.txt",
    ),
    CudaPath(
        name="gdn_packed_tiles",
        module="kda.kernels.scalar_gate",
        switch="PACKED_TILES",
        what={"en": "chunk_gated_delta_rule on packed sequences of at most 64 tokens each with no initial and no final "
                    "states (cu_seqlens_cpu given or read back): packed_tile_output, the whole forward in one kernel "
                    "over tiles of whole sequences (pairs of two sequences masked), instead of a chunk per sequence "
                    "through the inverse and the sequential pass",
              "zh": "chunk_gated_delta_rule 处理每条都不超过 64 个 token、且没有初始状态和最终状态的打包序列时"
                    "（给出 cu_seqlens_cpu 或读回边界）：由 packed_tile_output 在由整条序列拼成的 tile 上一个 kernel "
                    "算完整个前向（不同序列之间的位置对被屏蔽），取代每条序列一个块、经过求逆和顺序遍历的做法"},
        gpu_log="results/tuning/run157/gpu-tests.txt",
    ),
    CudaPath(
        name="gdn_packed_tile_checks_first",
        module="kda.kernels.scalar_gate",
        switch="TILE_CHECKS_FIRST",
        what={"en": "the packed tiles' value checks (gate, beta, keys) in a kernel of their own, token_value_checks, "
                    "queued before packed_tile_output, so that the host waits for the checks alone and returns while "
                    "the tiles are made",
              "zh": "把打包 tile 路径的数值检查（门控、beta、键）放进单独的 kernel token_value_checks，排在 "
                    "packed_tile_output 之前，主机只等检查结果，tile 仍在计算时就返回"},
        gpu_log="results/tuning/run162/gpu-tests.txt",
    ),
    CudaPath(
        name="gdn_packed_tile_checks_beside",
        module="kda.kernels.scalar_gate",
        switch="TILE_CHECKS_BESIDE",
        what={"en": "token_value_checks on a stream of its own beside packed_tile_output (validate.check_beside), so "
                    "that the GPU may run the two side by side; the host still waits for the checks alone",
              "zh": "token_value_checks 放在单独的 stream 上，与 packed_tile_output 并行（validate.check_beside），"
                    "让 GPU 可以同时运行两者；主机仍只等检查结果"},
    ),
    CudaPath(
        name="level5_stream_of_chunks",
        module="kda.gated_delta",
        switch="STREAM_OF_CHUNKS",
        what={"en": "chunk_kda (and GDN on level 5's path) on packed sequences with no initial and no final states: the "
                    "packed tokens cut into chunks as one sequence, the state reset where a sequence starts (chunk_intra's "
                    "stream masks), then the pass over the one stream",
              "zh": "chunk_kda（以及走第五级路径的 GDN）处理没有初始状态和最终状态的打包序列时：把打包的 token 当作一条序列"
                    "切块，在每条序列开始处把状态清零（chunk_intra 的 stream 掩码），再对这一条流做顺序遍历"},
    ),
    CudaPath(
        name="level5_sequence_tiles",
        module="kda.gated_delta",
        switch="TILES_OF_SHORT_SEQUENCES",
        what={"en": "chunk_kda (and GDN on level 5's path) on packed sequences of at most 64 tokens each with no initial "
                    "and no final states: tiles of whole sequences as the chunks, chunk_intra keeping the pairs of one "
                    "sequence (tile_sequences), the pass from zero states over the tiles",
              "zh": "chunk_kda（以及走第五级路径的 GDN）处理每条都不超过 64 个 token、且没有初始状态和最终状态的打包序列时，"
                    "以由整条序列拼成的 tile 作为块：chunk_intra 只保留同一序列内的位置对（tile_sequences），再从零状态出发"
                    "对这些 tile 做顺序遍历"},
    ),
    CudaPath(
        name="split_ragged_runs",
        module="kda.distributed",
        switch="RAGGED_RUNS",
        what={"en": "GDN's intra-card split reading each sequence's last run where it lies, short where T is not a whole "
                    "number of runs (inverse_state_output_pass's runs form), instead of padding q, k, v, g and beta to "
                    "whole runs and copying o back",
              "zh": "GDN 的卡内切分就地读取每条序列的最后一段（T 不是整数段时这一段较短；inverse_state_output_pass 的 "
                    "runs 形式），不再把 q、k、v、g、beta 补零到整数段、再把 o 拷回"},
        gpu_log="results/tuning/run161/gpu-tests.txt",
    ),
    CudaPath(
        name="gdn_beta_in_its_dtype",
        module="kda.kernels.scalar_gate",
        switch="BETA_IN_ITS_DTYPE",
        what={"en": "GDN's first kernel (and packed_tile_output) reading a bf16 or fp16 beta as it is, instead of a "
                    "float32 copy made first (a launch and a pass over it)",
              "zh": "GDN 的第一个 kernel（以及 packed_tile_output）直接读取 bf16 或 fp16 的 beta，不再先拷贝成 float32"
                    "（省去一次启动和一遍读写）"},
        gpu_log="results/tuning/run153/gpu-tests.txt",
    ),
    CudaPath(
        name="gdn_gate_free_in_split",
        module="kda.kernels.scalar_gate",
        switch="GATE_FREE_IN_SPLIT",
        what={"en": "GDN's intra-card split with the inverse made without the gate and gated by the passes (the "
                    "unsplit op keeps the gated inverse)",
              "zh": "GDN 的卡内切分改用不带门控的逆矩阵、由两趟遍历施加门控（不切分的算子仍用带门控的逆矩阵）"},
        gpu_log="results/tuning/run153/gpu-tests.txt",
    ),
    CudaPath(
        name="walk_identities",
        module="kda.backward",
        switch="WALK_IDENTITIES",
        what={"en": "the chunk kernels of the backward (GDN's chunk_gradients, KDA's chunk_state_gradients) with the "
                    "reverse walk's identities: V' = T X, one Y = T^T dV' for dV and dW, dA = -stril(Y V'^T); "
                    "15 GEMMs a chunk instead of 20 (GDN), 9 instead of 14 (KDA)",
              "zh": "反向的块内 kernel（GDN 的 chunk_gradients、KDA 的 chunk_state_gradients）采用逆向遍历的恒等式："
                    "V' = T X，用同一个 Y = T^T dV' 求 dV 与 dW，dA = -stril(Y V'^T)；每块的 GEMM 由 20 个减到 15 个（GDN），"
                    "由 14 个减到 9 个（KDA）"},
        gpu_log="results/tuning/run153/gpu-tests.txt",
    ),
    CudaPath(
        name="level_passes_from_inputs",
        module="kda.backward",
        switch="LEVEL_PASSES_FROM_INPUTS",
        what={"en": "the backward of levels 1-3 with a gate per head or none without pieces: the two state passes "
                    "read the op's q, k, v, do and each chunk's cumulative gate and scale them themselves",
              "zh": "第一至三级（每个头一个门控或没有门控）的反向不再生成中间量：两趟状态遍历直接读取算子的 q、k、v、do "
                    "与每块的累积门控，自行缩放"},
        gpu_log="results/tuning/run103/gpu-tests-switches.txt",
    ),
    CudaPath(
        name="packed_state_kernels",
        module="kda.backward",
        switch="PACKED_STATE_KERNELS",
        what={"en": "the backward's two state passes for packed sequences (cu_seqlens) by the state kernels, one "
                    "launch each and one block per sequence, instead of torch passes sequence by sequence",
              "zh": "打包序列（cu_seqlens）反向的两趟状态遍历由状态遍历 kernel 完成，每趟一次启动、每个序列一个 block，"
                    "取代逐个序列的 torch 遍历"},
        gpu_log="results/tuning/run103/gpu-tests-switches.txt",
    ),
    CudaPath(
        name="l2norm_in_kernel",
        module="kda.gated_delta",
        switch="L2NORM_IN_KERNEL",
        what={"en": "use_qk_l2norm_in_kernel on level 5's path: chunk_intra divides each row of q and k by its L2 "
                    "norm as it loads them, instead of torch making normalized copies through float32 first",
              "zh": "第五级路径上的 use_qk_l2norm_in_kernel：chunk_intra 在读入 q 与 k 时把每一行除以它的 L2 范数，"
                    "不再先由 torch 经 float32 生成归一化的副本"},
        gpu_log="results/tuning/run103/gpu-tests-switches.txt",
    ),
    CudaPath(
        name="pairwise_by_products",
        module="kda.kernels.chunk_intra",
        switch="PAIRWISE_BY_PRODUCTS",
        what={"en": "chunk_intra's steep chunks (a layer's gates; chunk_kda and level 3's gated_attention per channel) "
                    "with each pair's decay a running product of the token decays, one exponential per token and "
                    "channel, instead of one per pair and channel",
              "zh": "chunk_intra 的陡块（模型层的门控）中，每一对的衰减取各 token 衰减的累乘，每个 token、每个通道只求"
                    "一次指数，而不是每一对、每个通道求一次"},
        gpu_log="results/tuning/run103/gpu-tests-switches.txt",
    ),
    CudaPath(
        name="pairwise_by_halvings",
        module="kda.kernels.chunk_intra",
        switch="PAIRWISE_BY_HALVINGS",
        what={"en": "chunk_intra's steep chunks (a layer's gates; chunk_kda in bf16 and level 3's gated_attention per "
                    "channel) with their diagonal blocks by halvings: the pairs across the halves of blocks of 16, 8, 4 "
                    "and 2 rows as GEMMs through the upper half's last row, instead of one exponential per pair and "
                    "channel",
              "zh": "chunk_intra 的陡块（模型层的门控）的对角块按对半划分：16、8、4、2 行的块中跨越上下两半的对，"
                    "经上半块最后一行化为 GEMM，而不是每一对、每个通道求一次指数"},
        gpu_log="results/tuning/run108/gpu-tests-steep.txt",
    ),
    CudaPath(
        name="device_chunk_tables",
        module="kda.gated_delta",
        switch="DEVICE_CHUNK_TABLES",
        what={"en": "a packed chunk_kda or chunk_gated_delta_rule captured in a CUDA graph, its chunk table built on "
                    "the device (kda.packed.device_chunk_table), so that the graph replays with other boundaries of "
                    "the same T and N",
              "zh": "在 CUDA graph 中捕获打包的 chunk_kda 或 chunk_gated_delta_rule：chunk 表在设备上构建"
                    "（kda.packed.device_chunk_table），图可以用 T 与 N 相同的其他边界重放"},
        gpu_log="results/tuning/run111/gpu-tests.txt",
    ),
    CudaPath(
        name="deferred_decode_checks",
        module="kda.decode",
        switch="DEFERRED_CHECKS",
        what={"en": "a checked decode step that does not wait for its GPU value checks: their flags are read at the "
                    "next decode call (or by kda.decode.raise_pending_checks), which raises the flagged step's error",
              "zh": "检查取值但不等待 GPU 检查结果的解码步：标志在下一次解码调用时（或由 "
                    "kda.decode.raise_pending_checks）读取，若有坏值则在那里报出那一步的错误"},
        gpu_log="results/tuning/run111/gpu-tests.txt",
    ),
    CudaPath(
        name="token_slots_decode",
        module="kda.kernels.decode",
        switch="TOKEN_SLOTS",
        what={"en": "speculative decoding on CUDA (fused_recurrent_kda and fused_recurrent_gated_delta_rule with "
                    "ssm_state_indices [N, T_max] and num_accepted_tokens): the decode kernel stores the state after "
                    "every token to its pool slot and starts from the last accepted token's",
              "zh": "CUDA 上的投机解码（fused_recurrent_kda 与 fused_recurrent_gated_delta_rule 带 ssm_state_indices "
                    "[N, T_max] 和 num_accepted_tokens）：解码 kernel 把每个 token 之后的状态存入各自的状态池槽位，"
                    "并从上一步最后一个被接受的 token 的槽位开始"},
        gpu_log="results/tuning/run111/gpu-tests.txt",
    ),
    CudaPath(
        name="solve_by_halves",
        module="kda.kernels.chunk_intra",
        switch="SOLVE_BY_HALVES",
        what={"en": "chunk_intra's solve (chunk_kda, and GDN by level 5's path) with the lower-left 32 x 32 half of "
                    "the inverse by two tf32 GEMMs instead of block substitution on the CUDA cores",
              "zh": "chunk_intra 的求逆（chunk_kda，以及走第 5 级路径的 GDN）中，逆矩阵左下 32 x 32 的一半改由两次 "
                    "tf32 GEMM 求得，而不在 CUDA core 上逐块回代"},
        gpu_log="results/tuning/run111/gpu-tests.txt",
    ),
    CudaPath(
        name="diagonal_about_middles",
        module="kda.kernels.chunk_intra",
        switch="DIAGONAL_ABOUT_MIDDLES",
        what={"en": "chunk_intra's steep chunks in bf16 whose gate falls by at most 2^96 over each half of every "
                    "16-row sub-chunk (every safe_gate gate) with their diagonal blocks from one GEMM about each "
                    "sub-chunk's middle row, instead of the pairwise sums",
              "zh": "chunk_intra 中 bf16 的陡块：若门控在每个 16 行子块的每一半内下降不超过 2^96（safe_gate 的门控"
                    "都满足），其对角块由一次以各子块中间行为参照的 GEMM 算出，而不用逐对求和"},
        gpu_log="results/tuning/run108/gpu-tests-steep.txt",
    ),
    CudaPath(
        name="steep_for_activated_gates",
        module="kda.kernels.chunk_intra",
        switch="STEEP_FOR_ACTIVATED_GATES",
        what={"en": "chunk_intra compiled for steep chunks (halvings; with the middles for safe_gate's sigmoid form) "
                    "where it activates a layer's raw gate itself (ACTIVATIONS_IN_KERNEL), bf16",
              "zh": "chunk_intra 自行激活层的原始门控时（ACTIVATIONS_IN_KERNEL），按陡峭块编译（对半划分；safe_gate 的 "
                    "sigmoid 形式再加上以中间行为基准的对角块），bf16"},
        gpu_log="results/tuning/run121/gpu-tests.txt",
    ),
    CudaPath(
        name="middles_by_rows",
        module="kda.kernels.chunk_intra",
        switch="MIDDLES_BY_ROWS",
        what={"en": "chunk_intra's diagonal blocks about each sub-chunk's middle row (DIAGONAL_ABOUT_MIDDLES, safe_gate's "
                    "activated form) as two GEMMs of 64 rows instead of one of the stacked 128, bf16: 108 KB of "
                    "shared memory, two blocks per SM",
              "zh": "chunk_intra 以各子块中间行为基准的对角块（DIAGONAL_ABOUT_MIDDLES，以及 safe_gate 的激活形式）改为两次"
                    " 64 行的 GEMM，而不是一次 128 行堆叠的 GEMM，bf16：共享内存 108 KB，每个 SM 两个 block"},
        gpu_log="results/tuning/run125/gpu-tests.txt",
    ),
    CudaPath(
        name="reload_from_kept",
        module="kda.kernels.chunk_intra",
        switch="RELOAD_FROM_KEPT",
        gpu_log="results/tuning/run126/gpu-tests.txt",
        what={"en": "chunk_intra's steep chunks, bf16: the cumulative gate parked in a float32 buffer and the rows' "
                    "inverse norms kept in shared memory for the diagonal's second load, instead of loading, "
                    "activating and summing the gate and normalizing q and k again",
              "zh": "chunk_intra 的陡块（bf16）：累积门控暂存在一个 float32 缓冲区里，各行范数的倒数留在共享内存中，"
                    "供对角块第二次载入时直接取用，不再重新载入、激活并累加门控，也不再重新归一化 q 与 k"},
    ),
    CudaPath(
        name="capped_steps",
        module="kda.kernels.chunk_intra",
        switch="CAPPED_STEPS",
        # run 130 passed the first form's tests (a walk per element, timed slower in run 131), run 133 those of the
        # pass down the chunk that replaced it, run 134 the layer's tests with it on by default
        gpu_log="results/tuning/run133/gpu-tests.txt",
        what={"en": "chunk_intra's steep chunks, bf16: the diagonal blocks by one GEMM per score matrix about each "
                    "sub-chunk's middle row, every token's fall capped at 12 in log2, instead of the halvings "
                    "(gates given activated and the layer's softplus gate, not safe_gate's)",
              "zh": "chunk_intra 的陡块（bf16）：对角块改为围绕每个子块中间行、每个得分矩阵一次 GEMM，"
                    "每个 token 的下降在 log2 下截到 12，取代逐次减半（用于调用方已激活的门控与层的 softplus 门控，不用于 safe_gate）"},
    ),
    CudaPath(
        name="fast_activations",
        module="kda.kernels.chunk_intra",
        switch="FAST_ACTIVATIONS",
        gpu_log="results/tuning/run126/gpu-tests.txt",
        what={"en": "chunk_intra's activations in the kernel (softplus, the sigmoids) by the ex2 and lg2 instructions "
                    "instead of the library's log1pf and expf, bf16",
              "zh": "chunk_intra 在 kernel 内的激活（softplus 与 sigmoid）改用 ex2 与 lg2 指令，"
                    "而不是库函数 log1pf 与 expf，bf16"},
    ),
    CudaPath(
        name="pair_sums_by_products",
        module="kda.backward",
        switch="PAIR_SUMS_BY_PRODUCTS",
        what={"en": "KDA's backward pair sums inside a sub-chunk (chunk_pair_gradients) with each pair's decay a "
                    "running product of the token decays, one exponential per token and channel",
              "zh": "KDA 反向中子块内的成对求和（chunk_pair_gradients）把每一对的衰减取为各 token 衰减的累乘，每个 "
                    "token、每个通道只求一次指数"},
        gpu_log="results/tuning/run103/gpu-tests-switches.txt",
    ),
    CudaPath(
        name="key_check_in_kernel",
        module="kda.gated_delta",
        switch="KEY_CHECK_IN_KERNEL",
        what={"en": "with check_values, raw keys checked against the delta rule's bound (beta ||k||^2 <= 2) in "
                    "the first kernel's value checks (chunk_intra as it loads them; GDN's chunk_gated_inverse from "
                    "its K K^T)",
              "zh": "check_values 时，在第一个 kernel 的取值检查里检查原始键是否满足 delta 规则的界"
                    "（beta ||k||^2 <= 2）（chunk_intra 随加载检查；GDN 的 chunk_gated_inverse 由其 K K^T 检查）"},
        gpu_log="results/tuning/run108/gpu-tests-steep.txt",
    ),
    CudaPath(
        name="pair_sums_by_halvings",
        module="kda.backward",
        switch="PAIR_SUMS_BY_HALVINGS",
        what={"en": "KDA's backward pair sums (chunk_pair_gradients) by halvings: the pairs across the two halves of "
                    "blocks of 64, 32, .. rows as GEMMs through the upper half's last row, only the pairs inside "
                    "blocks of PAIR_HALVINGS_TO rows one by one",
              "zh": "KDA 反向的成对求和（chunk_pair_gradients）按对半划分：64、32……行的块中跨越上下两半的对，"
                    "经上半块最后一行化为 GEMM，只有 PAIR_HALVINGS_TO 行的块内的对逐对求和"},
        gpu_log="results/tuning/run107/gpu-tests-steep.txt",
    ),
    CudaPath(
        name="warmup_starts",
        module="kda.distributed",
        switch="WARMUP_STARTS",
        what={"en": "split_forward starting each run from the last chunks of the run before it alone (one pass over "
                    "those windows from zero), where every gate falls by e^-24 or more over them and their keys are "
                    "within the delta rule's bound, instead of the runs' maps and their fold",
              "zh": "split_forward 让每一段只从前一段末尾的几个块出发（对这些窗口从零状态做一趟遍历）：只要每个门控在"
                    "窗口内衰减到 e^-24 以下、且窗口内的键满足 delta 规则的界，就以此取代各段的映射及其折叠"},
        gpu_log="results/tuning/run111/gpu-tests.txt",
    ),
    CudaPath(
        name="split_grouped_values",
        module="kda.distributed",
        switch="SPLIT_GROUPED_VALUES",
        what={"en": "grouped value heads through split_forward, context_parallel and the op's split (q and k repeated "
                    "to the value heads, then the ungrouped kernels)",
              "zh": "分组的 value 头经由 split_forward、context_parallel 与算子自行切分计算（先把 q、k 重复到 value 头的"
                    "个数，再用不分组的 kernel）"},
        gpu_log="results/tuning/run121/gpu-tests.txt",
    ),
    CudaPath(
        name="split_in_op",
        module="kda.gated_delta",
        switch="SPLIT_IN_OP",
        what={"en": "chunk_kda and chunk_gated_delta_rule (dense) through split_forward with "
                    "warm-up starts where its rule splits (kda.distributed.op_split): GDN by the scalar-gate pass "
                    "where the op's own blocks would leave SMs idle, long sequences with few heads",
              "zh": "chunk_kda 与 chunk_gated_delta_rule（非打包）在切分规则认为值得时经由带预热起点的 "
                    "split_forward 计算（kda.distributed.op_split）：GDN 在自身 block 会让 SM 空闲时走标量门控遍历，"
                    "以及头数少的长序列"},
        gpu_log="results/tuning/run118/gpu-tests.txt",
    ),
    CudaPath(
        name="activations_in_kernel",
        module="kda.gated_delta",
        switch="ACTIVATIONS_IN_KERNEL",
        what={"en": "chunk_kda as a model calls it (use_gate_in_kernel, use_beta_sigmoid_in_kernel), not "
                    "differentiated: chunk_intra activates the raw gate and beta as it loads them, instead of torch's "
                    "activated float32 copies first",
              "zh": "模型调用 chunk_kda 的方式（use_gate_in_kernel、use_beta_sigmoid_in_kernel），不求导时：chunk_intra "
                    "在读入原始门控与 beta 时就地激活，不再先由 torch 生成激活后的 float32 副本"},
        gpu_log="results/tuning/run103/gpu-tests-switches.txt",
    ),
    CudaPath(
        name="l2norm_kernel",
        module="kda.gated_delta",
        switch="L2NORM_KERNEL",
        what={"en": "use_qk_l2norm_in_kernel where the kernels do not normalize as they load (GDN's scalar-gate "
                    "path): one kernel per tensor (kda/kernels/norms.py) instead of torch's copies through float32",
              "zh": "在 kernel 读入时不做归一化的路径上（GDN 的标量门控路径）实现 use_qk_l2norm_in_kernel：每个张量一次 "
                    "kernel（kda/kernels/norms.py），取代 torch 经 float32 的多次拷贝"},
        gpu_log="results/tuning/run103/gpu-tests-switches.txt",
    ),
    CudaPath(
        name="layer_kernels",
        module="kda.layer",
        switch="LAYER_KERNELS",
        gpu_log="results/tuning/run136/gpu-tests.txt",
        what={"en": "kda.layer.KimiDeltaAttention's short convolutions and gated output norm by kernels of their own "
                    "(kda/kernels/causal_conv.py, gated_rms_norm_rows), not differentiated",
              "zh": "kda.layer.KimiDeltaAttention 的短卷积与带门控的输出范数改由各自的 kernel 完成"
                    "（kda/kernels/causal_conv.py、gated_rms_norm_rows），不求导"},
    ),
    CudaPath(
        name="gdn_single_chunk_output",
        module="kda.kernels.scalar_gate",
        switch="SINGLE_CHUNK_OUTPUT",
        what={"en": "chunk_gated_delta_rule on packed sequences of at most 64 tokens each (cu_seqlens_cpu given or "
                    "read back): single_chunk_output, one small block per sequence, head and 64 value columns with "
                    "no chain, instead of the scalar-gate pass that carries groups of sequences one by one",
              "zh": "chunk_gated_delta_rule 处理每条都不超过 64 个 token 的打包序列时（给出 cu_seqlens_cpu 或读回边界）："
                    "由 single_chunk_output 为每个（序列、头、64 个值列）分配一个小 block，没有串行链，取代逐条"
                    "处理序列组的标量门控 pass"},
        gpu_log="results/tuning/run147/gpu-tests.txt",
    ),
    CudaPath(
        name="kda_single_chunk_output",
        module="kda.kernels.gated_state_pass",
        switch="SINGLE_CHUNK_OUTPUT",
        what={"en": "chunk_kda (and GDN by level 5's path) on packed sequences of at most 64 tokens each "
                    "(cu_seqlens_cpu given or read back): single_chunk_gated_output, one small block per sequence, "
                    "head and 64 value columns with no chain, instead of the state pass that carries groups of "
                    "sequences one by one",
              "zh": "chunk_kda（以及走第 5 级路径的 GDN）处理每条都不超过 64 个 token 的打包序列时（给出 cu_seqlens_cpu "
                    "或读回边界）：由 single_chunk_gated_output 为每个（序列、头、64 个值列）分配一个小 block，"
                    "没有串行链，取代逐条处理序列组的状态 pass"},
        gpu_log="results/tuning/run147/gpu-tests.txt",
    ),
    CudaPath(
        name="gdn_gate_free_inverse",
        module="kda.kernels.scalar_gate",
        switch="GATE_FREE_INVERSE",
        what={"en": "chunk_gated_delta_rule's scalar-gate path with the first kernel's inverse made without the gate "
                    "(no exponential of a pair there) and gated by the pass's warpgroup 1 while it waits for the "
                    "chain's state, or by single_chunk_output",
              "zh": "chunk_gated_delta_rule 的标量门控路径：第一个 kernel 求逆时不带门控（那里不再对每一对取指数），"
                    "改由 pass 的第 1 个 warpgroup 在等待串行链的状态时施加门控，或由 single_chunk_output 施加"},
        gpu_log="results/tuning/run147/gpu-tests.txt",
    ),
)


def by_name(name: str) -> CudaPath:
    return next(p for p in PATHS if p.name == name)


def enabled(path: CudaPath) -> bool:
    return bool(getattr(importlib.import_module(path.module), path.switch))


def unverified(paths=None) -> list[CudaPath]:
    """The paths still off by default (no GPU test log yet)."""
    return [p for p in (PATHS if paths is None else paths) if p.gpu_log is None]


def tested_but_off(paths=None) -> list[CudaPath]:
    """The paths that passed their GPU tests and still stay off by default (slower where measured, or not
    timed yet)."""
    return [p for p in (PATHS if paths is None else paths) if p.gpu_log is not None and not enabled(p)]


def require(path: CudaPath, call: str) -> None:
    """Raise a clear error where ``call`` needs ``path`` and its switch is off."""
    if not enabled(path):
        if path.gpu_log is None:
            why, how = "has not yet passed its GPU tests and is off by default", "to run it unverified"
        else:
            why, how = (f"passed its GPU tests ({path.gpu_log}) but is off by default (slower where timed, or not "
                        "timed yet)", "to use it")
        raise NotImplementedError(f"{call} needs the CUDA path '{path.name}', which {why}; set "
                                  f"{path.module}.{path.switch} = True {how}, or use CPU tensors (the float64 path)")
