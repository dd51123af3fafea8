"""Host model of binary_weight_planes_wgmma.cu (W1A16 at few rows as bit planes on the b1 wgmma), no GPU: numpy only.

1. The math: x rows scaled by one 2^shift a row (|xq| < 2^22), 24 two's-complement planes, popcounts of W & plane
   over each K slice, 2 sum_p coef_p count_p - sum(xq) per slice, scaled back and summed in fp32 as the cluster
   reduction does; against the float64 product, relative to the magnitude sqrt(sum (x w)^2) (the tests allow 1e-4).
2. The epilogue's indexing: the wgmma D fragment (binary_linear_wgmma.cu's header: d[4i + e] = feature 16 w + g,
   column 8i + 2t + e; d[4i + 2 + e] = feature + 8) read the way the kernel reads it (sub-tile r / kRowsPerSub,
   groups 3 (r % kRowsPerSub) + j, 4^t 2^(8j) (c0 + 2 c1), the top plane negative, the quad's sum) for every tile
   (MR, SLABS): must equal 2 sum_p coef_p C[f][24 r + p] - Q[r] exactly.
Run: python3 benchmarks/kernels/pending/planes_wgmma_model.py
"""
import numpy as np


def bf16(x):
    bits = x.astype(np.float32).view(np.uint32)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).view(np.float32)


def math_model(rng, m, n, k, slices, octaves=20):
    x = bf16(rng.standard_normal((m, k)) * np.exp2(rng.integers(-octaves, 4, (m, k))))
    w = rng.integers(0, 2, (n, k))
    stages = -(-k // 1024)
    per = -(-stages // slices)
    out = np.zeros((m, n), dtype=np.float32)
    for row in range(m):
        e = np.frexp(np.abs(x[row]).max())[1]
        shift = 24 - 2 - e
        q = np.rint(x[row].astype(np.float64) * 2.0**shift).astype(np.int64)
        assert np.abs(q).max() < 2**22
        planes = (q[None, :] >> np.arange(24)[:, None]) & 1
        coef = np.array([2**p for p in range(23)] + [-(2**23)])
        for r in range(slices):
            lo, hi = min(k, r * per * 1024), min(k, (r + 1) * per * 1024)
            if lo >= hi:
                continue
            counts = (planes[None, :, lo:hi] & w[:, None, lo:hi]).sum(-1)  # [n, 24]
            dot = 2 * (counts * coef).sum(-1) - q[lo:hi].sum()
            out[row] += (dot * 2.0**-shift).astype(np.float32)
    xd = x.astype(np.float64)
    s = (2 * w - 1).astype(np.float64)
    want = xd @ s.T
    magnitude = np.sqrt((xd**2) @ (s**2).T)
    return (np.abs(out - want) / magnitude).max()


def fragment_model(rng, mr, slabs):
    p = 24 * mr
    k_sub = 2 if mr > 8 else 1
    k_n, rows_per_sub, features = p // k_sub, mr // k_sub, 128 * slabs
    c = rng.integers(0, 5000, (features, p))
    q = rng.integers(-(10**6), 10**6, mr)
    coef = np.array([2**i for i in range(23)] + [-(2**23)])
    want = np.array([[2 * (c[f, 24 * r:24 * r + 24] * coef).sum() - q[r] for f in range(features)] for r in range(mr)])
    got = np.zeros((mr, features), dtype=np.int64)
    for wg in range(2):
        for w4 in range(4):
            quad = {}
            for lane in range(32):
                g, t = lane >> 2, lane & 3
                acc = np.zeros((slabs, k_sub, k_n // 2), dtype=np.int64)
                for slab in range(slabs):
                    for sub in range(k_sub):
                        for i in range(k_n // 8):
                            for h in range(2):
                                for e in range(2):
                                    acc[slab, sub, 4 * i + 2 * h + e] = c[64 * (slabs * wg + slab) + 16 * w4 + g + 8 * h,
                                                                          sub * k_n + 8 * i + 2 * t + e]
                top = -2 if t == 3 else 2
                for slab in range(slabs):
                    for r in range(mr):
                        sub, i0 = r // rows_per_sub, 3 * (r % rows_per_sub)
                        for h in range(2):
                            lane_sum = 0
                            for j in range(3):
                                c0, c1 = acc[slab, sub, 4 * (i0 + j) + 2 * h], acc[slab, sub, 4 * (i0 + j) + 2 * h + 1]
                                lane_sum += (c0 + c1 * (top if j == 2 else 2)) * (1 << (8 * j))
                            key = (slab, r, h, g)
                            quad[key] = quad.get(key, 0) + lane_sum * (1 << (2 * t))
            for (slab, r, h, g), total in quad.items():
                got[r, 64 * (slabs * wg + slab) + 16 * w4 + g + 8 * h] = 2 * total - q[r]
    return np.array_equal(got, want)


if __name__ == "__main__":
    rng = np.random.default_rng(0)
    for m, n, k, slices in ((5, 40, 3000, 3), (2, 33, 1024, 1), (1, 17, 9216, 8), (16, 8, 4224, 5)):
        print(f"math m={m} n={n} k={k} slices={slices}: worst error {math_model(rng, m, n, k, slices):.3g} of magnitude")
    for mr, slabs in ((1, 1), (1, 2), (2, 1), (2, 2), (4, 1), (4, 2), (8, 1), (8, 2), (16, 1)):
        print(f"fragment MR={mr} SLABS={slabs}: {'exact' if fragment_model(rng, mr, slabs) else 'MISMATCH'}")
