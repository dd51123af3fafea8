# pending/conv_halo.patch: run `python3 benchmarks/kernels/pending/conv_halo_emu.py` (no GPU, no torch).
# Emulates the halo kernel's shared-memory fill and A-row addresses (pending/conv_halo.patch) for every pixel of a
# few shapes: the 4 pixels an A row reads must be input (oh + kh - 1, ow - 1 .. ow + 2), zero outside the image.
import itertools
def rows(W): return (127 + W - 1) // W + 1 + 2
def pitch(W): return (W + 3 + 1) // 2 * 2
def check(B, H, W):
    plane = H * W; tiles = -(-plane // 128)
    copy_bytes = (rows(W) * pitch(W) * 8 + 127) // 128 * 128 + 64
    assert 2 * copy_bytes <= 64 * 1024 or W > 2048
    for image in range(B):
        for t in range(tiles):
            p0 = t * 128; rv = min(128, plane - p0); ohf = p0 // W
            hr = (p0 + rv - 1) // W - ohf + 3
            assert hr <= rows(W), (H, W, t, hr)
            P = pitch(W); mem = {}
            for e in range(2 * hr * P):
                c = 1 if e >= hr * P else 0; q = e - c * hr * P; s, j = divmod(q, P)
                ih, iw = ohf - 1 + s, j - 1 + c
                fill = 0 <= ih < H and 0 <= iw < W
                mem[c * copy_bytes + q * 8] = (image, ih, iw) if fill else None
            for r in range(rv):
                p = p0 + r; oh, ow = divmod(p, W)
                for half in (0, 1):
                    base = (ow & 1) * copy_bytes + ((oh - ohf) * P + (ow & ~1)) * 8 + half * 16
                    assert base % 16 == 0
                    for kh in range(3):
                        for k in range(2):
                            a = base + kh * P * 8 + k * 8
                            kw = 2 * half + k  # pixel index within the A row
                            ih, iw = oh + kh - 1, ow - 1 + kw
                            want = (image, ih, iw) if 0 <= ih < H and 0 <= iw < W else None
                            got = mem.get(a, "OUT OF HALO")
                            if kw < 3: assert got == want, (B, H, W, t, r, kh, kw, got, want)
                            else: assert got != "OUT OF HALO", (H, W, r, kh)
    return True
for B, H, W in [(2, 56, 56), (1, 9, 9), (2, 13, 11), (2, 5, 7), (1, 3, 130), (2, 17, 1), (1, 12, 9), (1, 10, 10), (1, 2, 2), (1, 1, 1), (1, 7, 200)]:
    check(B, H, W)
print("halo addressing ok")
