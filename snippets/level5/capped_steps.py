# snippet: cpu
"""KDA's output error when a steep chunk's diagonal blocks cap every token's fall at chunk_intra's step_cap
(DIAGONAL_SPAN_MAX over half a 16-row sub-chunk, in log2 units), against the exact scores: T = 256, H = 2, D = 128,
q, k and v rounded to bf16, float64 arithmetic, the capped blocks in every chunk."""
from kda.kernels.chunk_intra import SUBCHUNK, step_cap
from kda.site.runtime import text
from kda.tables import level5

cap = step_cap(SUBCHUNK)
print(text(zh=f"每个 token 的下降截到 {cap:g}（以 2 为底）：跨过截断步的一对，真实衰减不到 2^-{cap:g}\n",
           en=f"each token's fall capped at {cap:g} (log2): a pair across a capped step decays by less than "
              f"2^-{cap:g} anyway\n"))
print(level5.capped_steps_error(cap))
