#!/usr/bin/env python3
"""Host model of binary_conv2d_wgmma_kernel (csrc/cuda/binary_conv2d_wgmma.cu), no GPU needed.

1. Layout and math (--blocks, default on): every block of random shapes is emulated thread by thread with the
   kernel's own index formulas: the producer's gather (chunk / row mapping, tap and channel word stepped per stage,
   the SW128 destination, the zero-fill predicate), TMA's swizzled B box, the wgmma k steps read back through the
   descriptor's swizzle, the row popcounts pa of the m64n8 wgmmas against the all-ones rows (the stage's issued k
   steps only), conv_tap_table_kernel's D_t table (the weights' tail mask), the accumulator fragment layout into the
   E1 tile, E2's per-row correction from the table (channels_last and NCHW lane mappings) and E3's stores. The integer dot of every output is compared with a direct convolution
   (any pad value, stride, dilation, kernel size, channel tails), every output must be written exactly once.
2. Protocol (--protocol): randomized interleavings of the producer threads (cp.async groups, wait_group LAG, proxy
   fence + arrive), thread 0's TMA with expect_tx, the consumer warps (full wait, wgmma groups, wait_group 1, empty
   arrive) with mbarrier phases, parities and tx counts modelled; flags a hang, a write into a stage still read, a
   read of a stage not fully written.
3. --mutations: re-runs 2 with one protocol bug injected at a time; each must be caught (the model's own test).

    python benchmarks/kernels/conv_wgmma_model.py [--blocks N] [--protocol SEEDS] [--mutations]

Keep it in step with the kernel when the kernel changes.
"""
import argparse
import random
import sys

import numpy as np

BM, STAGE_WORDS, MAX_TAPS = 128, 32, 32
LAYOUT_MUTATION = None  # an index bug injected into emulate() (--mutations)
LAYOUT_MUTATIONS = ["no_swizzle", "no_tail_mask", "no_carry", "e1_rows", "pa_reads_tail"]
PRODUCERS, THREADS = 64, 320  # the kernel's producer threads (2 warps) and all threads (E2: 10 warps)


def popc(x):
    return bin(int(x) & 0xFFFFFFFF).count("1")


def valid_bits(k, word):
    left = k - word * 32
    return 0xFFFFFFFF if left >= 32 else (0 if left <= 0 else (1 << left) - 1)


def inside_taps(top, left, kh, kw, dh, dw, h, w):
    columns = 0
    for j in range(kw):
        ix = left + j * dw
        columns |= int(0 <= ix < w) << j
    inside = 0
    for i in range(kh):
        iy = top + i * dh
        if 0 <= iy < h:
            inside |= columns << (i * kw)
    return inside


class Shape:
    def __init__(self, rng, **kw):
        self.batch = kw.get("batch", rng.randint(1, 3))
        self.cw = kw.get("cw", rng.choice([4, 8, 12, 16]))
        self.channels = kw.get("channels", self.cw * 32 - rng.choice([0, 0, 1, 5, 31]))
        self.height = kw.get("height", rng.randint(1, 9))
        self.width = kw.get("width", rng.randint(1, 9))
        self.kh = kw.get("kh", rng.choice([1, 3, 3, 5, 2]))
        self.kw = kw.get("kw", rng.choice([self.kh, self.kh, 1, 4]))
        while self.kh * self.kw > MAX_TAPS:
            self.kw -= 1
        self.stride = kw.get("stride", rng.choice([1, 1, 2, 3]))
        self.pad = kw.get("pad", rng.choice([0, 1, 2]))
        self.dil = kw.get("dil", rng.choice([1, 1, 2]))
        self.pad_value = kw.get("pad_value", rng.choice([-1, 0, 1]))
        self.out_channels = kw.get("out_channels", rng.choice([1, 5, 63, 65, 129, 200, 257]))
        self.bn = kw.get("bn", rng.choice([128, 256]))
        self.out_h = (self.height + 2 * self.pad - self.dil * (self.kh - 1) - 1) // self.stride + 1
        self.out_w = (self.width + 2 * self.pad - self.dil * (self.kw - 1) - 1) // self.stride + 1

    def ok(self):
        return self.out_h > 0 and self.out_w > 0

    def __repr__(self):
        return (f"b={self.batch} c={self.channels} {self.height}x{self.width} oc={self.out_channels} "
                f"k{self.kh}x{self.kw} s{self.stride} p{self.pad} d{self.dil} padv={self.pad_value} bn={self.bn}")


class BlockMismatch(Exception):
    pass


def reference_dots(s, x, w):
    """Direct convolution of s(x) in {-1, +1} (pad_value at padded taps) with s(w), integer dots [pixels, oc]."""
    taps = s.kh * s.kw
    pixels = s.batch * s.out_h * s.out_w
    out = np.zeros((pixels, s.out_channels), dtype=np.int64)
    # +-1 values per (pixel, channel) and (oc, tap, channel)
    xs = np.zeros((s.batch, s.height, s.width, s.channels), dtype=np.int64)
    for c in range(s.channels):
        xs[..., c] = np.where((x[..., c // 32] >> np.uint32(c % 32)) & np.uint32(1), 1, -1)
    ws = np.zeros((s.out_channels, taps, s.channels), dtype=np.int64)
    for c in range(s.channels):
        ws[..., c] = np.where((w[..., c // 32] >> np.uint32(c % 32)) & np.uint32(1), 1, -1)
    for p in range(pixels):
        b, rem = divmod(p, s.out_h * s.out_w)
        oh, ow = divmod(rem, s.out_w)
        for t in range(taps):
            ih = oh * s.stride - s.pad + (t // s.kw) * s.dil
            iw = ow * s.stride - s.pad + (t % s.kw) * s.dil
            if 0 <= ih < s.height and 0 <= iw < s.width:
                out[p] += ws[:, t, :] @ xs[b, ih, iw]
            else:
                out[p] += s.pad_value * ws[:, t, :].sum(axis=1)
    return out


def emulate(s, x_words, w_words, nchw):
    """The kernel, block by block, thread by thread; returns the integer dots [pixels, oc] it would store."""
    cw, taps, bn = s.cw, s.kh * s.kw, s.bn
    reduction_words = taps * cw
    kblocks = (reduction_words + STAGE_WORDS - 1) // STAGE_WORDS
    total = s.batch * s.out_h * s.out_w
    plane = s.out_h * s.out_w
    m_tiles = (total + BM - 1) // BM
    n_tiles = (s.out_channels + bn - 1) // bn
    flat_x = x_words.reshape(-1)
    w_rows = w_words.reshape(s.out_channels, reduction_words)
    result = np.full((total, s.out_channels), np.iinfo(np.int64).min, dtype=np.int64)
    writes = np.zeros((total, s.out_channels), dtype=np.int64)
    tap_step, word_step = STAGE_WORDS // cw, STAGE_WORDS % cw
    last_bits = valid_bits(s.channels, cw - 1)
    all_taps = 0xFFFFFFFF if taps >= 32 else (1 << taps) - 1
    tap_offset = []
    for t in range(taps):
        kh = t // s.kw
        tap_offset.append((kh * s.dil * s.width + (t - kh * s.kw) * s.dil) * cw)
    garbage = np.random.default_rng(12345)
    # conv_tap_table_kernel: D_t of output channel n = C - 2 popc(tap t of row n, real channels only)
    table = np.zeros((taps, s.out_channels), dtype=np.int64)
    for n in range(s.out_channels):
        for t in range(taps):
            words = [int(v) for v in w_rows[n, t * cw:(t + 1) * cw]]
            if LAYOUT_MUTATION != "no_tail_mask":
                words[-1] &= last_bits
            table[t, n] = s.channels - 2 * sum(popc(v) for v in words)
    for block in range(m_tiles * n_tiles):
        m0 = (block % m_tiles) * BM
        n0 = (block // m_tiles) * bn
        # prologue: rows
        row_source, row_inside, row_out = [0] * BM, [0] * BM, [0] * BM
        for r in range(BM):
            p = m0 + r
            if p < total:
                image, position = divmod(p, plane)
                oh, ow = divmod(position, s.out_w)
                top, left = oh * s.stride - s.pad, ow * s.stride - s.pad
                row_source[r] = ((image * s.height + top) * s.width + left) * cw
                row_inside[r] = inside_taps(top, left, s.kh, s.kw, s.dil, s.dil, s.height, s.width)
                row_out[r] = image * s.out_channels * plane + position
        # the consumers' cp.async of the table: D_t of the block's columns (0 past the last output channel)
        tap_d = np.zeros((taps, bn), dtype=np.int64)
        cols_in = min(bn, s.out_channels - n0)
        tap_d[:, :cols_in] = table[:, n0:n0 + cols_in]
        acc = np.zeros((BM, bn), dtype=np.int64)  # D of both consumer warpgroups (rows 64 wg + ...)
        pa = np.zeros(BM, dtype=np.int64)         # the n8 wgmmas' accumulators (every column of a row the same)
        # producer state per thread
        prod = []
        for tid in range(PRODUCERS):
            chunk, row0 = tid & 7, tid >> 3
            prod.append({"chunk": chunk, "row0": row0, "tap": 4 * chunk // cw, "word": 4 * chunk % cw})
        rows_each, row_groups = BM // (PRODUCERS // 8), PRODUCERS // 8
        steps_words = (reduction_words + 7) & ~7
        for kb in range(kblocks):
            stage = bytearray(garbage.bytes(16384 + bn * 128))  # a ring slot holds stale words of earlier stages
            # producer: rows_each cp.async of 16 bytes a thread
            for st in prod:
                tap, word = st["tap"], st["word"]
                in_taps = tap < taps
                tap_bit = tap if in_taps else 0
                offset = tap_offset[tap_bit] + word
                copied = kb * 32 + 4 * st["chunk"] < steps_words or LAYOUT_MUTATION == "no_copy_skip"
                for i in range(rows_each if copied else 0):
                    r = st["row0"] + row_groups * i
                    fill = in_taps and (row_inside[r] >> tap_bit) & 1
                    dst = st["row0"] * 128 + ((st["chunk"] ^ (st["row0"] & 7)) * 16) + i * row_groups * 128
                    if LAYOUT_MUTATION == "no_swizzle":
                        dst = r * 128 + st["chunk"] * 16
                    assert LAYOUT_MUTATION or dst == r * 128 + ((st["chunk"] ^ (r & 7)) * 16)
                    if fill:
                        src = row_source[r] + offset
                        assert 0 <= src and src + 4 <= len(flat_x), "gather out of bounds"
                        stage[dst:dst + 16] = flat_x[src:src + 4].astype("<u4").tobytes()
                    else:
                        stage[dst:dst + 16] = bytes(16)
                st["tap"] += tap_step
                st["word"] += word_step
                if st["word"] >= cw and LAYOUT_MUTATION != "no_carry":
                    st["word"] -= cw
                    st["tap"] += 1
            # TMA: box of 32 words x bn rows at (kb * 32, n0), SWIZZLE_128B, zero fill out of bounds
            for n in range(bn):
                for q in range(8):
                    words = []
                    for e in range(4):
                        col, row = kb * 32 + 4 * q + e, n0 + n
                        words.append(int(w_rows[row, col]) if row < s.out_channels and col < reduction_words else 0)
                    dst = 16384 + n * 128 + ((q ^ (n & 7)) * 16)
                    stage[dst:dst + 16] = np.array(words, dtype="<u4").tobytes()
            sw = np.frombuffer(bytes(stage), dtype="<u4")

            def chunk_words(base, row, q):  # logical chunk q of a SW128 row, as the descriptor / swizzle reads it
                phys = base + row * 128 + ((q ^ (row & 7)) * 16)
                return sw[phys // 4:phys // 4 + 4]

            steps = min(4, (reduction_words - kb * 32 + 7) // 8)
            # wgmma: for wg, j < steps: D[64 x bn] += popc(A rows & B rows) over bytes 32j..32j+31 (chunks 2j, 2j+1)
            for wg in range(2):
                for j in range(steps):
                    a = np.array([np.concatenate([chunk_words(wg * 8192, r, 2 * j), chunk_words(wg * 8192, r, 2 * j + 1)])
                                  for r in range(64)], dtype=np.uint32)
                    b = np.array([np.concatenate([chunk_words(16384, n, 2 * j), chunk_words(16384, n, 2 * j + 1)])
                                  for n in range(bn)], dtype=np.uint32)
                    both = a[:, None, :] & b[None, :, :]
                    acc[wg * 64:(wg + 1) * 64] += np.vectorize(popc)(both).sum(axis=2)
            # m64n8k256 against the all-ones rows: pa[row] += popc of the row's 32 bytes of each issued k step
            for r in range(BM):
                for j2 in range(4 if LAYOUT_MUTATION == "pa_reads_tail" else steps):
                    wg, row = r // 64, r % 64
                    words = np.concatenate([chunk_words(wg * 8192, row, 2 * j2), chunk_words(wg * 8192, row, 2 * j2 + 1)])
                    pa[r] += sum(popc(v) for v in words)
        # E1 (the accumulator fragment: acc[4i + 2h + e] = row 16 w4 + lane / 4 + 8h, col 8i + 2 q + e; pa's n8
        # fragment the same rows: pa[0] / pa[2] of the thread)
        stride = bn + 8
        tile = {}
        for wg in range(2):
            for warp4 in range(4):
                for lane in range(32):
                    quad = lane & 3
                    r_top = wg * 64 + warp4 * 16 + (lane >> 2)
                    term_top, term_bottom = -2 * pa[r_top], -2 * pa[r_top + 8]
                    for i in range(bn // 8):
                        for h, term in ((0, term_top), (1, term_bottom)):
                            base = (r_top * stride + 2 * quad) * 4 + (8 * stride * 4 if h else 0) + i * 32
                            for e in range(2):
                                row, col = r_top + 8 * h, 8 * i + 2 * quad + e
                                if LAYOUT_MUTATION == "e1_rows" and h:
                                    row = r_top + 1
                                addr = base + 4 * e
                                assert addr not in tile
                                tile[addr] = 4 * acc[row, col] + term
        # E2 / E3
        rows_valid = min(BM, total - m0)
        cols_valid = min(bn, s.out_channels - n0)
        lanes_per_row = bn // 8
        rows_per_warp = 32 // lanes_per_row
        row_step = (THREADS // 32) * rows_per_warp
        pad_weight = -(1 + s.pad_value)  # of a padded tap's D_t
        lines = {}
        for tid in range(THREADS):
            warp, lane = tid >> 5, tid & 31
            row_sub, lane_in_row = lane // lanes_per_row, lane % lanes_per_row
            first_row = warp * rows_per_warp + row_sub
            col_base = 8 * lane_in_row if not nchw else lane_in_row
            col_step = 1 if not nchw else lanes_per_row
            cols = [col_base + e * col_step for e in range(8)]
            all_d = [int(tap_d[:, c].sum()) for c in cols]
            r = first_row
            while r < rows_valid:
                v = [tile[(r * stride + c) * 4] for c in cols]
                padded = ~row_inside[r] & all_taps
                v = [v[e] + all_d[e] for e in range(8)]
                if pad_weight:
                    left = padded
                    while left:
                        t = (left & -left).bit_length() - 1
                        v = [v[e] + pad_weight * tap_d[t, cols[e]] for e in range(8)]
                        left &= left - 1
                for e in range(8):
                    c = cols[e]
                    if not nchw:
                        if c < cols_valid:
                            result[m0 + r, n0 + c] = v[e]
                            writes[m0 + r, n0 + c] += 1
                    else:
                        lines[(c, r)] = v[e]
                r += row_step
        if nchw:  # E3: consumer thread tid stores pixel tid % 128 of channels tid / 128 + 2 j
            for tid in range(256):
                r = tid % BM
                if r >= rows_valid:
                    continue
                c = tid // BM
                while c < cols_valid:
                    offset = row_out[r] + (n0 + c) * plane
                    image, rem = divmod(offset, s.out_channels * plane)
                    channel, position = divmod(rem, plane)
                    p = image * plane + position
                    assert channel == n0 + c and p == m0 + r
                    result[p, channel] = lines[(c, r)]
                    writes[p, channel] += 1
                    c += 2
    return result, writes


def check_blocks(count, seed, quiet=False):
    """The first `count` shapes (the fixed edge cases, then random ones); raises BlockMismatch on the first wrong one."""
    rng = random.Random(seed)
    fixed = [  # the sweep's edges first
        dict(batch=1, cw=8, channels=256, height=5, width=7, kh=3, kw=3, stride=1, pad=1, dil=1, pad_value=0,
             out_channels=257, bn=256),
        dict(batch=2, cw=4, channels=100, height=6, width=5, kh=3, kw=3, stride=2, pad=1, dil=2, pad_value=1,
             out_channels=65, bn=128),
        dict(batch=1, cw=12, channels=384, height=4, width=4, kh=5, kw=5, stride=1, pad=2, dil=1, pad_value=-1,
             out_channels=63, bn=256),
        dict(batch=2, cw=4, channels=128, height=3, width=3, kh=1, kw=1, stride=1, pad=0, dil=1, pad_value=0,
             out_channels=1, bn=128),
        dict(batch=1, cw=4, channels=97, height=9, width=9, kh=4, kw=8, stride=1, pad=2, dil=1, pad_value=1,
             out_channels=129, bn=256),  # 32 taps
        dict(batch=3, cw=16, channels=512, height=3, width=3, kh=3, kw=3, stride=1, pad=1, dil=1, pad_value=0,
             out_channels=130, bn=128),
    ]
    done = 0
    while done < count:
        kw = fixed[done] if done < len(fixed) else {}
        s = Shape(rng, **kw)
        if not s.ok() or s.batch * s.out_h * s.out_w > 300:
            if done < len(fixed):
                raise SystemExit(f"fixed shape {kw} is invalid")
            continue
        np_rng = np.random.default_rng(rng.randrange(1 << 30))
        x = np_rng.integers(0, 1 << 32, size=(s.batch, s.height, s.width, s.cw), dtype=np.uint64).astype(np.uint32)
        x[..., -1] &= np.uint32(valid_bits(s.channels, s.cw - 1))  # x's tail bits are 0 (pack_signs)
        w = np_rng.integers(0, 1 << 32, size=(s.out_channels, s.kh * s.kw, s.cw), dtype=np.uint64).astype(np.uint32)
        # w's stray tail bits stay set: the kernel must ignore them
        want = reference_dots(s, x, w)
        for nchw in (False, True):
            got, writes = emulate(s, x, w, nchw)
            if not (writes == 1).all():
                raise BlockMismatch(f"{s} nchw={nchw}: outputs written {writes.min()}..{writes.max()} times")
            bad = np.argwhere(got != want)
            if len(bad):
                p, o = bad[0]
                raise BlockMismatch(f"{s} nchw={nchw}: {len(bad)} wrong, first (pixel {p}, oc {o}) "
                                    f"got {got[p, o]} want {want[p, o]}")
        if not quiet:
            print(f"ok {s}")
        done += 1
    return True


# ---- protocol ---------------------------------------------------------------------------------------------------
class MBarrier:
    def __init__(self, count):
        self.count, self.pending, self.tx, self.phase = count, count, 0, 0

    def _complete(self):
        if self.pending == 0 and self.tx == 0:
            self.phase += 1
            self.pending = self.count

    def arrive(self, expect_tx=0):
        assert self.pending > 0, "arrival on a completed phase"
        self.tx += expect_tx
        self.pending -= 1
        self._complete()

    def complete_tx(self, nbytes):
        self.tx -= nbytes
        self._complete()

    def done(self, parity):  # try_wait.parity: the phase of this parity has completed
        return (self.phase & 1) != parity


def protocol_run(seed, stages, kblocks, producers=4, warps=4, mutation=None, limit=200000):
    """Producer threads (thread 0 also issues the TMA boxes; full count = producers + 1) and consumer warps (empty
    count = warps), randomly interleaved with the asynchronous completions (cp.async groups in any order, TMA boxes,
    each warp's wgmma groups in order). Returns None if clean, else the first violation."""
    rng = random.Random(seed)
    lag = min(stages - 2, 2) if mutation != "lag_too_big" else stages - 1
    full = [MBarrier(producers + 1 if mutation != "full_count_low" else producers) for _ in range(stages)]
    empty = [MBarrier(warps) for _ in range(stages)]
    slot_stage = [None] * stages                      # the stage whose writes into the slot have all landed
    writes_pending = [dict() for _ in range(stages)]  # slot -> {writer: stage} of copies in flight
    readers = [set() for _ in range(stages)]          # slot -> (warp, stage) issued and not yet released
    cp_groups = [[] for _ in range(producers)]        # per thread: [stage, slot, landed]
    wgmma_groups = [[] for _ in range(warps)]         # per warp: [stage, slot, complete]
    inflight_tma = []                                 # (slot, stage)

    def write_begin(slot, kb, who):
        busy = [g[0] for w in range(warps) for g in wgmma_groups[w] if g[1] == slot and not g[2]]
        if readers[slot] or busy:
            raise AssertionError(f"write of stage {kb} into slot {slot} while read by {sorted(readers[slot])} "
                                 f"(wgmma in flight: {busy})")
        writes_pending[slot][who] = kb

    def producer(p):
        s, parity, published = 0, 0, 0
        if p == 0:  # the first stages' B boxes, right after the barrier init
            for kb in range(min(stages, kblocks)):
                full[kb].arrive(expect_tx=1)
                write_begin(kb, kb, ("tma", kb))
                inflight_tma.append((kb, kb))
        for kb in range(kblocks):
            if kb >= stages:
                wait_parity = parity ^ 1 if mutation != "empty_parity" else parity
                while not empty[s].done(wait_parity):
                    yield
                if p == 0:
                    full[s].arrive(expect_tx=1)
                    write_begin(s, kb, ("tma", kb))
                    inflight_tma.append((s, kb))
            write_begin(s, kb, ("cp", p, kb))
            cp_groups[p].append([kb, s, False])
            yield
            if kb >= lag:  # cp.async.wait_group lag: every group but the lag most recent ones has landed
                while mutation != "arrive_early" and not all(g[2] for g in cp_groups[p][:len(cp_groups[p]) - lag]):
                    yield
                full[published].arrive()
                published = (published + 1) % stages
            s += 1
            if s == stages:
                s, parity = 0, parity ^ 1
        while mutation != "arrive_early" and any(not g[2] for g in cp_groups[p]):
            yield
        for _ in range(max(kblocks - lag, 0), kblocks):
            full[published].arrive()
            published = (published + 1) % stages

    def consumer(wi):
        s, parity, previous = 0, 0, 0
        for kb in range(kblocks):
            while not full[s].done(parity):
                yield
            if writes_pending[s] or slot_stage[s] != kb:
                raise AssertionError(f"warp {wi} reads stage {kb} from slot {s} holding {slot_stage[s]} "
                                     f"with writes in flight {writes_pending[s]}")
            readers[s].add((wi, kb))
            wgmma_groups[wi].append([kb, s, False])
            yield  # the stage's popcount loads
            keep = 1 if mutation != "release_before_wait" else 1 << 30
            while not all(g[2] for g in wgmma_groups[wi][:max(len(wgmma_groups[wi]) - keep, 0)]):  # wait_group 1
                yield
            if kb > 0:
                readers[previous].discard((wi, kb - 1))
                empty[previous].arrive()
            previous = s
            s += 1
            if s == stages:
                s, parity = 0, parity ^ 1
        while any(not g[2] for g in wgmma_groups[wi]):  # wait_group 0
            yield
        readers[previous].discard((wi, kblocks - 1))

    programs = [producer(p) for p in range(producers)] + [consumer(w) for w in range(warps)]
    alive = list(range(len(programs)))
    steps = 0
    try:
        while alive:
            steps += 1
            if steps > limit:
                return f"hang (stages={stages} kblocks={kblocks})"
            r = rng.random()
            if r < 0.2:  # a cp.async group lands (a thread's groups in any order)
                pending = [(p, g) for p in range(producers) for g in cp_groups[p] if not g[2]]
                if pending:
                    p, g = rng.choice(pending)
                    g[2] = True
                    del writes_pending[g[1]][("cp", p, g[0])]
                    if not writes_pending[g[1]]:
                        slot_stage[g[1]] = g[0]
                    continue
            elif r < 0.3:  # a TMA box lands
                if inflight_tma:
                    slot, kb = inflight_tma.pop(rng.randrange(len(inflight_tma)))
                    del writes_pending[slot][("tma", kb)]
                    if not writes_pending[slot]:
                        slot_stage[slot] = kb
                    full[slot].complete_tx(1)
                    continue
            elif r < 0.4:  # a warp's oldest wgmma group completes
                w = rng.randrange(warps)
                for g in wgmma_groups[w]:
                    if not g[2]:
                        g[2] = True
                        break
                continue
            i = rng.choice(alive)
            try:
                next(programs[i])
            except StopIteration:
                alive.remove(i)
    except AssertionError as error:
        return str(error)
    # every stage consumed and every barrier phase balanced
    return None


def check_protocol(seeds, mutation=None):
    failures = []
    for seed in range(seeds):
        rng = random.Random(seed * 7919 + 1)
        stages = rng.randint(3, 6)
        kblocks = rng.randint(1, 14)
        res = protocol_run(seed, stages, kblocks, producers=rng.choice([2, 4]), warps=rng.choice([2, 4]),
                           mutation=mutation)
        if res is not None:
            failures.append((seed, stages, kblocks, res))
            if mutation is None:
                print(f"FAIL seed {seed} stages {stages} kblocks {kblocks}: {res}")
                return False
            return failures
    return True if mutation is None else failures


MUTATIONS = ["lag_too_big", "full_count_low", "empty_parity", "release_before_wait", "arrive_early"]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--blocks", type=int, default=40, help="random shapes emulated block by block (0: skip)")
    parser.add_argument("--protocol", type=int, default=300, help="randomized protocol interleavings (0: skip)")
    parser.add_argument("--mutations", action="store_true", help="each injected protocol bug must be caught")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    if args.blocks:
        try:
            check_blocks(args.blocks, args.seed)
        except BlockMismatch as error:
            print(f"FAIL {error}")
            sys.exit(1)
        print(f"layout/math: {args.blocks} shapes match the direct convolution (channels_last and NCHW)")
    if args.protocol:
        if not check_protocol(args.protocol):
            sys.exit(1)
        print(f"protocol: {args.protocol} interleavings clean")
    if args.mutations:
        global LAYOUT_MUTATION
        missed = []
        for m in LAYOUT_MUTATIONS:
            LAYOUT_MUTATION = m
            try:
                check_blocks(3, args.seed, quiet=True)
                print(f"layout mutation {m}: MISSED")
                missed.append(m)
            except (BlockMismatch, AssertionError) as error:
                print(f"layout mutation {m}: caught: {str(error)[:100]}")
        LAYOUT_MUTATION = None
        for m in MUTATIONS:
            caught = check_protocol(max(args.protocol, 100), mutation=m)
            print(f"mutation {m}: {'caught: ' + str(caught[0]) if caught else 'MISSED'}")
            if not caught:
                missed.append(m)
        if missed:
            sys.exit(1)


if __name__ == "__main__":
    main()
