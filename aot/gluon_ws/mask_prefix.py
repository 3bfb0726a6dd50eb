"""The visible-range check of the key-vector-masked cubins (MASK_PREFIX, every masked cubin the
build makes): each consumer first reads the mask over the keys its tile sees (_visible_range);
where they show one visible run [lo, end) and hide the rest (right padding, a batch with no
padding, or, without causal, left padding), the tile runs the unmasked loop over those end - lo
keys from lo (no mask loads, no padded blocks); any other mask runs the masked loop. The first
consumer passes the run to the producer through shared memory and an mbarrier (_publish_range,
_read_range); the producer loads Q and key block 0 before it waits for it (a run from lo > 0
starts at ring block 1 and the consumers drop block 0). An additive value counts as hidden at or
below HIDDEN_AT: the result then differs from the masked loop's only where a hidden key outscores
every visible one by more than ~9900 in scaled scores.
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier

# An additive mask value at or below this hides a key in the visible-range check (the rewriter's
# MIN_MASKED: exp of it underflows to 0 in fp32 unless a hidden key outscores every visible one by
# more than 9900 in the scaled scores).
HIDDEN_AT = gl.constexpr(-1.0e4)


@gluon.jit
def _visible_range(m_base, n, causal, MASK_KIND: gl.constexpr, NW: gl.constexpr):
    """(lo, end) if the mask's keys [0, n) show exactly one run [lo, end), end > lo, and hide the
    rest (bool: nonzero shown, zero hidden; additive: exactly 0 shown, at or below HIDDEN_AT
    hidden), lo 0 under causal; else (-1, -1). The keys a tile sees then run as an unmasked call
    over that run: the padding mask of right- (and, without causal, left-) padded batches costs no
    mask load and its padded blocks no work. Every row of the tile sees a shown key (non-causal:
    all of the run; causal: key 0), so dropping the hidden ones changes no result beyond their
    underflowed weights. Read in chunks of 16 values a thread."""
    CHUNK: gl.constexpr = 16 * 32 * NW
    layout: gl.constexpr = gl.BlockedLayout([16], [32], [NW], [0])
    first_shown = n
    last_shown = n * 0 - 1
    n_shown = n * 0
    first_not_hidden = n
    last_not_hidden = n * 0 - 1
    for start in range(0, n, CHUNK):
        cols = start + gl.arange(0, CHUNK, layout=layout)
        inb = cols < n
        v = gl.load(m_base + cols, mask=inb, other=0)
        if MASK_KIND == 2:
            vf = v.to(gl.float32)
            shown = inb & (vf == 0.0)
            not_hidden = inb & (vf > HIDDEN_AT)
        else:
            shown = inb & (v != 0)
            not_hidden = shown
        first_shown = gl.minimum(first_shown, gl.min(gl.where(shown, cols, n), axis=0))
        last_shown = gl.maximum(last_shown, gl.max(gl.where(shown, cols, -1), axis=0))
        n_shown += gl.sum(shown.to(gl.int32), axis=0)
        first_not_hidden = gl.minimum(first_not_hidden, gl.min(gl.where(not_hidden, cols, n), axis=0))
        last_not_hidden = gl.maximum(last_not_hidden, gl.max(gl.where(not_hidden, cols, -1), axis=0))
    ok = ((n_shown > 0) & (n_shown == last_shown + 1 - first_shown)
          & (first_not_hidden == first_shown) & (last_not_hidden == last_shown)
          & ((causal == 0) | (first_shown == 0)))
    return gl.where(ok, first_shown, -1), gl.where(ok, last_shown + 1, -1)


@gluon.jit
def _publish_range(lim_smem, lim_bar, lo, end, NW: gl.constexpr):
    """The first consumer's visible-range result, for the producer (which does not scan)."""
    layout: gl.constexpr = gl.BlockedLayout([2], [32], [NW], [0])
    idx = gl.arange(0, 2, layout=layout)
    lim_smem.store(gl.where(idx == 0, lo, end))
    gl.thread_barrier()  # every thread's store before the (one-thread) arrive: racecheck-clean
    mbarrier.arrive(lim_bar.index(0))


@gluon.jit
def _read_range(lim_smem, lim_bar):
    """The producer's side of _publish_range: the first consumer's (lo, end), once it is in."""
    mbarrier.wait(lim_bar.index(0), 0)
    idx = gl.arange(0, 2, layout=gl.BlockedLayout([2], [32], [1], [0]))
    rng = lim_smem.load(gl.BlockedLayout([2], [32], [1], [0]))
    lo = gl.sum(gl.where(idx == 0, rng, 0), axis=0)
    end = gl.sum(gl.where(idx == 1, rng, 0), axis=0)
    return lo, end
