#!/usr/bin/env python3
"""Host model of binary_conv2d_wgmma_halo_kernel (csrc/cuda/binary_conv2d_wgmma_halo.cu of
benchmarks/kernels/pending/conv_wgmma_halo.patch: correct on an H100, faster than the gather kernel at 28x28 only,
not on main's dispatch), no GPU needed.

Emulates the kernel's index formulas on random shapes: conv_wgmma_halo_geometry (group, items, blocks a tile, plane
pixels, the steps' chunk order), the (oh, ow) and halo (y, x) stepping by divmod(8 / 64 / 128, Wp), the B planes
(load_b), each warpgroup's items and its halo buffer (issue_halo: padded pixels from p0, zero outside the image), the
step table (chunk offsets and LBO), the wgmma operands read back through the no-swizzle K-major descriptors (row r of
a 64-row block at start + (r / 8) SBO + (r % 8) 16, its second 128-bit half LBO bytes on; B row n at plane + 16 n, its
second half one plane on), pa against the ones / half-ones operand, and the epilogue's integer (4 acc - 2 pa + sum_t
D_t - (1 + pad) sum_padded D_t) with the rows' validity and output pixel. Every output's integer dot is compared with
a direct convolution (pad values, kernel sizes, channel tails, stray weight bits past the channels), and every output
must be written exactly once. The descriptor semantics are the ones benchmarks/kernels/wgmma_halo_probe.cu checks on
the GPU. Not modelled: the 16-bit outputs' shared-memory tile (residual copy, values, one bulk store a row), whose
rows step as the epilogue's do; the harness check rows of pending/conv_wgmma_halo.sweep cover it on the GPU.

    python benchmarks/kernels/wgmma_halo_model.py [--shapes N] [--seed S] [--mutation NAME]

--mutation injects one index bug (each must be caught: `--mutations` runs them all).
"""
import argparse
import random
import sys

import numpy as np

BN, BLOCKS_PER_SM, MAX_STEPS = 128, 2, 64
SMEM_SHARE = 233472 // BLOCKS_PER_SM - 1024
MUTATIONS = ["no_swap", "lbo_next_pixel", "no_half_ones", "halo_no_pad_shift", "row_wp_as_ow", "plane_no_slack"]


def ceil_div(a, b):
    return -(-a // b)


def inside_taps(top, left, kh, kw, h, w):
    inside = 0
    for i in range(kh):
        for j in range(kw):
            if 0 <= top + i < h and 0 <= left + j < w:
                inside |= 1 << (i * kw + j)
    return inside


def inside_closed(oh, ow, ph, pw, kh, kw, h, w):
    """The kernel's closed form of the taps inside the image: kernel rows [lo_h, hi_h) x columns [lo_w, hi_w), the
    column mask times tap_rows (bit kh kw of every kernel row) masked to the rows."""
    tap_rows = sum(1 << (k * kw) for k in range(kh))
    lo_h, hi_h = max(0, ph - oh), min(kh, ph + h - oh)
    lo_w, hi_w = max(0, pw - ow), min(kw, pw + w - ow)
    if hi_h <= lo_h or hi_w <= lo_w:
        return 0
    columns, rows = (1 << hi_w) - (1 << lo_w), (1 << (hi_h * kw)) - (1 << (lo_h * kw))
    got = (columns * tap_rows & rows) & (2**64 - 1)
    assert got == inside_taps(oh - ph, ow - pw, kh, kw, h, w)
    return got


def geometry(s, sm_count, mutation):
    taps, cw = s["kh"] * s["kw"], ceil_div(s["c"], 32)
    wp = s["w"] + 2 * s["pw"]
    oh, ow = s["h"] + 2 * s["ph"] - s["kh"] + 1, s["w"] + 2 * s["pw"] - s["kw"] + 1
    rows = (oh - 1) * wp + ow
    k_chunks = taps * (cw // 4)
    steps = (k_chunks + 1) // 2
    m_blocks = ceil_div(rows, 64)
    n_tiles = ceil_div(s["oc"], BN)
    slots = 2 * sm_count * BLOCKS_PER_SM
    group = 2 if m_blocks >= 2 and s["b"] * ceil_div(m_blocks, 2) * n_tiles >= slots else 1
    groups_per_image = ceil_div(m_blocks, group)
    items = s["b"] * groups_per_image
    per_tile = max(1, sm_count * BLOCKS_PER_SM // n_tiles)
    extent = (s["kh"] - 1) * wp + s["kw"] - 1
    slack = 0 if mutation == "plane_no_slack" else 1
    plane_pixels = (group * 64 + extent + slack + 7) // 8 * 8
    g = dict(wp=wp, oh=oh, ow=ow, m_blocks=m_blocks, group=group, groups_per_image=groups_per_image, items=items,
             blocks_per_tile=min(ceil_div(items, 2), per_tile), plane_pixels=plane_pixels, chunks=cw // 4,
             k_chunks=k_chunks, steps=steps, n_tiles=n_tiles, taps=taps, cw=cw)
    smem = 2 * steps * BN * 16 + 4 * g["chunks"] * plane_pixels * 16 + taps * BN * 4 + BN * 12 + steps * 8 + 640
    return g if steps <= MAX_STEPS and smem <= SMEM_SHARE else None


def chunks_of(words):
    """[..., 4 q] uint32 words -> [..., q, 2] uint64 (16-byte chunks, word 0 in the low bits)."""
    w = words.astype(np.uint64).reshape(words.shape[:-1] + (-1, 2, 2))
    return w[..., 0] | (w[..., 1] << np.uint64(32))


def popc(a):
    return np.bitwise_count(a).sum(axis=-1).astype(np.int64)


def emulate(s, sm_count, rng, mutation=None):
    g = geometry(s, sm_count, mutation)
    if g is None:
        return None
    b_, c, h, w, oc, kh, kw, ph, pw = (s[k] for k in ("b", "c", "h", "w", "oc", "kh", "kw", "ph", "pw"))
    taps, cw, q = g["taps"], g["cw"], g["chunks"]
    tail = c - (cw - 1) * 32
    tail_mask = np.uint32(0xFFFFFFFF if tail >= 32 else (1 << tail) - 1)
    x_words = rng.integers(0, 2**32, size=(b_, h, w, cw), dtype=np.uint64).astype(np.uint32)
    x_words[..., -1] &= tail_mask  # pack_signs: no bits past the channels
    w_words = rng.integers(0, 2**32, size=(oc, taps, cw), dtype=np.uint64).astype(np.uint32)  # stray tail bits
    x_chunks, w_chunks = chunks_of(x_words), chunks_of(w_words.reshape(oc, taps * cw))  # [b,h,w,q,2], [oc,G,2]
    # conv_tap_table_kernel: D_t = C - 2 popc(w_t & real channels)
    masked = w_words.copy()
    masked[..., -1] &= tail_mask
    d_t = c - 2 * np.bitwise_count(masked).sum(axis=-1).astype(np.int64)  # [oc, taps]
    all_d = d_t.sum(axis=1)
    pad_weight = -(1 + s["pad_value"])
    wp, oh_n, ow_n = g["wp"], g["oh"], g["ow"]
    out = np.full((b_, oh_n, ow_n, oc), np.iinfo(np.int64).min, dtype=np.int64)
    writes = np.zeros((b_, oh_n, ow_n, oc), dtype=np.int64)
    # the step table
    step_first, step_lbo, step_swap = [], [], []
    for st in range(g["steps"]):
        def offset(ch):
            t, j = divmod(ch, q)
            i, jw = divmod(t, kw)
            return (j * g["plane_pixels"] + i * wp + jw) * 16
        swap = 2 * st + 1 < g["k_chunks"] and offset(2 * st + 1) < offset(2 * st)
        if mutation == "no_swap":
            swap = False
        first = offset(2 * st + swap)
        lbo = offset(2 * st + (not swap)) - first if 2 * st + 1 < g["k_chunks"] else 16
        if not 0 <= lbo < 1 << 18:  # the descriptor's LBO field: 14 bits of LBO >> 4, unsigned
            raise AssertionError(f"step {st}: LBO {lbo} does not fit the descriptor")
        if mutation == "lbo_next_pixel":
            lbo = 16
        step_first.append(first)
        step_lbo.append(lbo)
        step_swap.append(swap)
    odd = g["k_chunks"] % 2 == 1
    for tile in range(g["n_tiles"]):
        n0 = tile * BN
        cols = min(BN, oc - n0)
        # B planes: plane p row n (zero past G and past the last column)
        b_planes = np.zeros((2 * g["steps"], BN, 2), dtype=np.uint64)
        for p in range(2 * g["steps"]):
            ch = p ^ 1 if step_swap[p // 2] else p
            if ch < g["k_chunks"]:
                b_planes[p, :cols] = w_chunks[n0 : n0 + cols, ch]
        for slot in range(g["blocks_per_tile"]):
            for wg in range(2):
                for item in range(slot * 2 + wg, g["items"], 2 * g["blocks_per_tile"]):
                    image, grp = divmod(item, g["groups_per_image"])
                    p0 = grp * g["group"] * 64
                    # issue_halo: buffer bytes as 16-byte rows (plane j, pixel pix) at row j P + pix
                    halo = np.zeros((q * g["plane_pixels"] + 64, 2), dtype=np.uint64)  # + rows past the buffer
                    for pix in range(g["plane_pixels"]):
                        p = p0 + pix
                        # the kernel's stepping: thread pix % 128's first pixel by one division, + divmod(128, Wp)
                        y, xx = divmod(p0 + pix % 128, wp)
                        for _ in range(pix // 128):
                            quot, rem = divmod(128, wp)
                            y, xx = y + quot, xx + rem
                            if xx >= wp:
                                y, xx = y + 1, xx - wp
                        assert (y, xx) == divmod(p, wp)
                        iy, ix = y - ph, xx - pw
                        if mutation == "halo_no_pad_shift":
                            iy, ix = y, xx
                        if 0 <= iy < h and 0 <= ix < w:
                            for j in range(q):
                                halo[j * g["plane_pixels"] + pix] = x_chunks[image, iy, ix, j]
                    mb0 = grp * g["group"]
                    for blk in range(min(g["group"], g["m_blocks"] - mb0)):
                        acc = np.zeros((64, BN), dtype=np.int64)
                        pa = np.zeros(64, dtype=np.int64)
                        r = np.arange(64)
                        for st in range(g["steps"]):
                            start = blk * 64 * 16 + step_first[st]
                            row0 = (start + (r // 8) * 128 + (r % 8) * 16) // 16  # the descriptor's rows
                            row1 = row0 + step_lbo[st] // 16
                            if max(row0.max(), row1.max()) >= q * g["plane_pixels"]:
                                raise AssertionError(f"{s}: step {st} reads past the halo buffer")
                            a0, a1 = halo[row0], halo[row1]
                            b0, b1 = b_planes[2 * st], b_planes[2 * st + 1]
                            acc += popc(a0[:, None, :] & b0[None, :, :]) + popc(a1[:, None, :] & b1[None, :, :])
                            half = odd and st == g["steps"] - 1 and mutation != "no_half_ones"
                            pa += popc(a0) + (0 if half else popc(a1))
                        for rr in range(64):
                            m = (mb0 + blk) * 64 + rr
                            # the kernel's stepping: the thread's first row by one division an item, + divmod(64,
                            # Wp) a block, + divmod(8, Wp) for its second row, each with one carry
                            hh = (rr // 8) % 2
                            oh, ow = divmod(mb0 * 64 + rr - 8 * hh, wp)
                            for step in [64] * blk + [8] * hh:
                                quot, rem = divmod(step, wp)
                                oh, ow = oh + quot, ow + rem
                                if ow >= wp:
                                    oh, ow = oh + 1, ow - wp
                            assert (oh, ow) == divmod(m, wp)
                            if mutation == "row_wp_as_ow":
                                oh, ow = divmod(m, ow_n)
                            if not (oh < oh_n and ow < ow_n):
                                continue
                            inside = inside_closed(oh, ow, ph, pw, kh, kw, h, w)
                            left = ~inside & ((1 << taps) - 1) if pad_weight != 0 else 0
                            v = 4 * acc[rr, :cols] - 2 * pa[rr] + all_d[n0 : n0 + cols]
                            for t in range(taps):
                                if (left >> t) & 1:
                                    v = v + pad_weight * d_t[n0 : n0 + cols, t]
                            out[image, oh, ow, n0 : n0 + cols] = v
                            writes[image, oh, ow, n0 : n0 + cols] += 1
    # the direct convolution of s(x) with s(w) (padded positions pad_value)
    ch = np.arange(cw * 32)
    xs = np.where((x_words[..., ch // 32] >> (ch % 32).astype(np.uint32)) & 1, 1, -1)[..., :c]
    ws = np.where((w_words[..., ch // 32] >> (ch % 32).astype(np.uint32)) & 1, 1, -1)[..., :c]  # [oc, taps, c]
    xp = np.full((b_, h + 2 * ph, w + 2 * pw, c), s["pad_value"], dtype=np.int64)
    xp[:, ph : ph + h, pw : pw + w] = xs
    want = np.zeros((b_, oh_n, ow_n, oc), dtype=np.int64)
    for t in range(taps):
        i, j = divmod(t, kw)
        want += np.einsum("bhwc,oc->bhwo", xp[:, i : i + oh_n, j : j + ow_n], ws[:, t])
    bad = int((out != want).sum())
    twice = int((writes != 1).sum())
    return bad, twice, g


def random_shape(rng):
    kh, kw = rng.choice([(3, 3), (3, 3), (1, 1), (3, 1), (5, 5), (2, 3)])
    ph, pw = rng.randint(0, (kh + 1) // 2), rng.randint(0, (kw + 1) // 2)
    cw = rng.choice([4, 4, 8, 12])
    return dict(b=rng.randint(1, 3), c=cw * 32 - rng.choice([0, 0, 3, 31]), h=rng.randint(max(1, kh - 2 * ph), 12),
                w=rng.randint(max(1, kw - 2 * pw), 12), oc=rng.choice([8, 40, 72, 128, 129, 200]), kh=kh, kw=kw,
                ph=ph, pw=pw, pad_value=rng.choice([-1, 0, 1]))


def run(shapes, seed, mutation):
    rng = random.Random(seed)
    nrng = np.random.default_rng(seed)
    failures = 0
    done = 0
    while done < shapes:
        s = random_shape(rng)
        sm_count = rng.choice([1, 2, 132])
        try:
            result = emulate(s, sm_count, nrng, mutation)
        except (AssertionError, IndexError) as error:
            failures += 1
            if mutation is None:
                print(f"FAIL {s} sm {sm_count}: {error}")
            done += 1
            continue
        if result is None:
            continue
        bad, twice, g = result
        done += 1
        if bad or twice:
            failures += 1
            if mutation is None:
                print(f"FAIL {s} sm {sm_count} group {g['group']}: {bad} wrong, {twice} not written once")
    return failures


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--shapes", type=int, default=40)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--mutation", choices=MUTATIONS)
    parser.add_argument("--mutations", action="store_true")
    args = parser.parse_args()
    if args.mutations:
        missed = [m for m in MUTATIONS if run(args.shapes, args.seed, m) == 0]
        print("mutations caught:", len(MUTATIONS) - len(missed), "of", len(MUTATIONS), "missed:", missed)
        return 1 if missed else 0
    failures = run(args.shapes, args.seed, args.mutation)
    print(f"{args.shapes} shapes, {failures} failing")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
