"""The walk by halvings that the steep chunks' diagonal blocks (``kda.kernels.chunk_intra.chunk_intra``) and the
backward's pair sums (``kda.kernels.backward_chunks.halved_pair_sums``) take: pairs of rows whose decay is a product
of two factors ``<= 1`` through one row between them, so that they go by GEMMs for any gate."""


def halvings(C: int, sub: int) -> tuple:
    """The half-block sizes ``h`` of a walk by halvings of ``C`` rows down to blocks of ``sub``: ``C / 2, C / 4,
    .., sub``. For blocks of ``2h`` rows, a pair with ``i`` in a block's lower half and ``j`` in its upper half has
    the decay ``2^(G_i - G_b) 2^(G_b - G_j)``, ``b`` the upper half's last row, both factors ``<= 1``; every pair
    ``j < i`` of different blocks of ``sub`` rows meets in exactly one halving. A Python tuple: each halving is
    its own code (``kda.kernels.backward_chunks.halved_pair_sums``, ``kda.kernels.chunk_intra``'s steep chunks)."""
    return tuple(C >> n for n in range(1, (C // sub).bit_length()))


def upper_half_end(x, h):
    """The upper half's last row of the block of ``2h`` rows that holds row ``x`` (``b`` above): a row ``i > b`` lies in
    the lower half, a row ``j <= b`` in the upper. ``x`` a Python int or a TIR expression."""
    return (x // (2 * h)) * (2 * h) + h - 1
