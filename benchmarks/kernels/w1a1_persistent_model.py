#!/usr/bin/env python3
"""Host model of binary_linear_persistent_kernel (csrc/cuda/binary_linear_wgmma.cu), no GPU needed.

1. Layout: the TMA-store staging swizzle maps every accumulator element to its output row / column, the quads'
   pa chunks and the pb chunks cover each row's 8 chunks once, the static schedule covers every tile once (cluster
   1 and 2), the shared-memory budgets fit.
2. Protocol: randomized interleavings of the producer, 8 consumer warps a CTA, 1- or 2-CTA clusters (B multicast),
   wgmma groups, the pb barriers and the store-buffer rotation, with mbarrier phases and tx counts modelled; flags a
   hang (step limit), a TMA write into a stage still read, a wrong stage content, a stale pb, a staging buffer
   rewritten before its store read it.
3. --mutations: re-runs 2 with one protocol bug injected at a time; each must be caught (the model's own test).

    python benchmarks/kernels/w1a1_persistent_model.py [SEEDS] [--mutations]

Keep it in step with the kernel when the protocol changes.
"""
import itertools, random, subprocess, sys
# Host check of the persistent kernel's index math (mirrors binary_linear_wgmma.cu; no GPU).

def sw128(row, byte):  # physical byte offset in a 1024-aligned SW128 box of 128-byte rows
    return row * 128 + ((((byte >> 4) ^ (row & 7)) << 4) | (byte & 15))

def check_staging(BN, size):
    box_cols = 128 // size; boxes = BN // box_cols; groups = box_cols // 8
    for wg in range(2):
        seen = {}
        for b in range(boxes):
            buf = {}
            for w4 in range(4):
                for lane in range(32):
                    quad_row = lane >> 2; r_local = w4 * 16 + quad_row; c_lane = 2 * (lane & 3)
                    for g in range(groups):
                        i = b * groups + g
                        for h in range(2):
                            row = r_local + 8 * h
                            assert row & 7 == quad_row
                            byte = (8 * g + c_lane) * size
                            p = row * 128 + ((((byte >> 4) ^ quad_row) << 4) | (byte & 15))
                            for e in range(2):  # the pair's two elements
                                off = p + e * size
                                assert off not in buf, ("overlap", BN, size, b)
                                # accumulator element acc[4i + 2h + e]: row 16 w4 + lane/4 + 8h, col 8i + 2(lane%4) + e
                                buf[off] = (wg * 64 + row, 8 * i + c_lane + e)
            # TMA store un-swizzles: element at logical (row, col_in_box) is read from sw128(row, col_in_box*size)
            assert len(buf) == 64 * box_cols
            for row in range(64):
                for cb in range(box_cols):
                    got = buf[sw128(row, cb * size)]
                    assert got == (wg * 64 + row, b * box_cols + cb), (got, row, cb)
    return True

def check_pa():
    for quad_row in range(8):
        chunks = []
        for q in range(4):
            chunks += [(2 * q) ^ quad_row, (2 * q + 1) ^ quad_row]
        assert sorted(chunks) == list(range(8))
    return True

def check_pb(BN):
    rows = {}
    for ct in range(256):
        b_row = ct if BN == 256 else ct >> 1
        first = 0 if BN == 256 else (ct & 1) * 4
        n = 8 if BN == 256 else 4
        for c in range(n):
            rows.setdefault(b_row, []).append(((first + c) ^ (b_row & 7)))
    assert sorted(rows) == list(range(BN))
    for r, ch in rows.items():
        assert sorted(ch) == list(range(8)), (r, ch)
    return True

def check_schedule(m_tiles, n_tiles, csize, clusters):
    m_groups = (m_tiles + csize - 1) // csize
    units = m_groups * n_tiles
    clusters = min(clusters, units)
    per, extra = divmod(units, clusters)
    covered = []
    for cl in range(clusters):
        ub = cl * per + min(cl, extra); ue = ub + per + (1 if cl < extra else 0)
        for u in range(ub, ue):
            n_tile = u // m_groups
            for rank in range(csize):
                m_tile = (u - n_tile * m_groups) * csize + rank
                covered.append((m_tile, n_tile))
    real = sorted(t for t in covered if t[0] < m_tiles)
    assert real == sorted(itertools.product(range(m_tiles), range(n_tiles))), (m_tiles, n_tiles, csize)
    assert len(covered) == len(set(covered))
    return True

def check_smem():
    lim = 227 * 1024
    for BN in (128, 256):
        stage = (128 + BN) * 128
        for tma, S in ((True, 3 if BN == 256 else 5), (False, 4 if BN == 256 else 6)):
            for S2 in (S, S + 1) if tma else (S,):
                bufs = 0 if not tma else (4 if S2 * stage + 2 * 4 * 8192 + BN * 4 + 16 * S2 + 1024 <= lim else 2)
                total = S2 * stage + 2 * bufs * 8192 + BN * 4 + 16 * S2 + 1024
                assert total <= lim, (BN, tma, S2, total)
                assert (S2 * stage) % 1024 == 0 and (S2 * stage + 2 * bufs * 8192 + BN * 4) % 8 == 0
                print(f"BN={BN} {'tma' if tma else 'stg'} stages={S2} buffers={bufs}: {total} bytes ({total/1024:.1f} KiB)")
    return True

def layout_checks():
    assert check_pa() and check_pb(128) and check_pb(256)
    for BN in (128, 256):
        for size in (4, 2):
            check_staging(BN, size)
    for m in (1, 2, 3, 5, 32, 33, 64):
        for n in (1, 2, 7, 32, 33):
            for cs in (1, 2):
                for cl in (1, 3, 66, 132):
                    check_schedule(m, n, cs, cl)
    check_smem()
    print("layout checks pass")

# Randomized-interleaving model of the persistent kernel's synchronization (binary_linear_wgmma.cu): mbarrier
# phases with tx counts, TMA loads (A own, B halves multicast to both CTAs of a cluster), wgmma groups of each
# consumer warpgroup, per-warp empty arrivals (local + remote), the pb barriers, the TMA-store buffer rotation.
# Flags: deadlock, a TMA write into a stage still being read / not yet read, a consumer reading the wrong
# content, a pb read of the wrong n tile, a staging write into a buffer whose store has not been read yet.

class Mbar:
    def __init__(self, count, name):
        self.count, self.pending, self.tx, self.phase, self.name = count, count, 0, 0, name
        self.round = 0
    def _check(self):
        if self.pending == 0 and self.tx == 0:
            self.phase ^= 1; self.round += 1; self.pending = self.count
    def arrive(self, expect=0):
        assert self.pending > 0, f"{self.name}: too many arrivals"
        self.tx += expect; self.pending -= 1; self._check()
    def complete_tx(self, n, rnd):
        assert rnd == self.round, f"{self.name}: bytes of round {rnd} landed in round {self.round}"
        self.tx -= n; self._check()
    def done(self, parity):  # try_wait.parity: the phase with this parity has completed
        return self.phase != parity

class Sim:
    def __init__(self, seed, csize, S, kblocks, units_runs, bufs, m_groups):
        self.r = random.Random(seed)
        self.csize, self.S, self.kblocks, self.bufs = csize, S, kblocks, bufs
        self.agents, self.events = [], []
        self.ctas = []
        for c in range(csize):
            cta = dict(full=[Mbar(1, f"cta{c}.full{s}") for s in range(S)],
                       empty=[Mbar(8 * csize, f"cta{c}.empty{s}") for s in range(S)],
                       content=[[None, None, None] for _ in range(S)],   # A, B half 0, B half 1 tags
                       readers=[set() for _ in range(S)],               # in-flight wgmma groups reading stage s
                       consumed=[[0] * 8 for _ in range(S)],            # warp w read round count of stage s
                       pb=None, bars={}, staging={}, groups={0: [], 1: []}, issued={0: [], 1: []}, wg_groups={0: {}, 1: {}},
                       wg_issue={0: {}, 1: {}})
            self.ctas.append(cta)
        self.runs = units_runs  # list of (m_tile_group, n_tile) per unit, same for both CTAs of the cluster
        self.m_groups = m_groups
        for c in range(csize):
            self.agents.append(self.producer(c))
            for w in range(8):
                self.agents.append(self.consumer(c, w))

    # ---- named barrier: generation counting ----
    def bar_sync(self, c, bid, count):
        bars = self.ctas[c]['bars']
        st = bars.setdefault(bid, dict(arrived=0, gen=0))
        gen = st['gen']; st['arrived'] += 1
        if st['arrived'] == count // 32:
            st['arrived'] = 0; st['gen'] += 1
        while st['gen'] == gen:
            yield

    def producer(self, c):
        S, cta = self.S, self.ctas[c]
        s = phase = it = 0
        for (mg, n) in self.runs:
            for kb in range(self.kblocks):
                if it >= S:
                    bar = cta['empty'][s]; par = phase ^ 1
                    while not bar.done(par): yield
                tag = (mg, n, kb)
                cta['full'][s].arrive(expect=3 * 100 if self.csize == 2 else 300)  # A 100 + B 200 "bytes"
                rnd = cta['full'][s].round
                self.events.append(self.tma(c, s, 0, tag, 100, rnd, [c]))
                if self.csize == 1:
                    self.events.append(self.tma(c, s, 'B', tag, 200, rnd, [c]))
                else:
                    self.events.append(self.tma(c, s, 1 + c, tag, 100, rnd, [0, 1]))
                it += 1; s += 1
                if s == S: s = 0; phase ^= 1

    def tma(self, src, s, region, tag, nbytes, rnd, dests):
        # lands in each destination at its own random time
        pending = list(dests)
        while pending:
            yield
            if self.r.random() < 0.3:
                d = pending.pop(self.r.randrange(len(pending)))
                cta = self.ctas[d]
                assert not cta['readers'][s], f"TMA write into cta{d} stage {s} while wgmma groups read it"
                regions = [1, 2] if region == 'B' else [region]
                for reg in regions:
                    cta['content'][s][reg] = tag
                # the stage's previous content must have been read by all 8 consumer warps of this CTA
                full = cta['full'][s]
                r_expected = full.round  # this round's content
                assert all(x >= r_expected for x in cta['consumed'][s]), \
                    f"TMA overwrote cta{d} stage {s} round {r_expected} before all warps read round {r_expected - 1}"
                full.complete_tx(nbytes, full.round)

    def wgmma_group(self, c, wg, key, s):
        cta = self.ctas[c]
        while True:
            yield
            if self.r.random() < 0.2:
                cta['readers'][s].discard((wg, key))
                cta['wg_groups'][wg][key] = 'done'
                return

    def store_group(self, c, wg, key):
        cta = self.ctas[c]
        while True:
            yield
            if self.r.random() < 0.15:
                cta['staging'][(wg, key[1])] = None  # buffer read by the TMA engine
                cta['groups'][wg].remove(key)
                return

    def consumer(self, c, w):
        S, cta, wg, w4 = self.S, self.ctas[c], w // 4, w % 4
        s = phase = 0
        box = 0
        last_n = None
        it = 0
        my_groups = []  # keys of this WG's wgmma groups this warp committed
        for (mg, n) in self.runs:
            need_pb = n != last_n; last_n = n
            prev = None
            for kb in range(self.kblocks):
                bar = cta['full'][s]
                while not bar.done(phase): yield
                want = (mg, n, kb)
                got = cta['content'][s]
                assert all(g == want for g in got), f"cta{c} warp{w} stage {s}: read {got}, want {want}"
                cta['consumed'][s][w] += 1
                # wgmma issue: the WG's group starts once all 4 warps issued (aligned); model: warp-level issue,
                # group key = (it); the group reads the stage until complete.
                key = it
                issued = cta['wg_issue'][wg].setdefault(key, 0) + 1
                cta['wg_issue'][wg][key] = issued
                if issued == 4:
                    cta['readers'][s].add((wg, key))
                    cta['wg_groups'][wg][key] = 'running'
                    self.events.append(self.wgmma_group(c, wg, key, s))
                my_groups.append(key)
                yield
                # wait_group<1>: all groups but the newest complete (a group only completes after all 4 issued)
                while not all(cta['wg_groups'][wg].get(g) == 'done' for g in my_groups[:-1]): yield
                if prev is not None:
                    self.release(c, prev)
                prev = s; it += 1; s += 1
                if s == S: s = 0; phase ^= 1
            while not all(cta['wg_groups'][wg].get(g) == 'done' for g in my_groups): yield
            self.release(c, prev)
            # epilogue
            if need_pb:
                yield from self.bar_sync(c, 1, 256)
                cta['pb'] = n  # written by every consumer warp: same tag
                yield
                yield from self.bar_sync(c, 1, 256)
            yield
            assert cta['pb'] == n, f"cta{c} warp{w}: pb of n tile {cta['pb']}, want {n}"
            if self.bufs:
                for b in range(2):  # boxes of this tile (any count; 2 keeps it short)
                    slot = box & (self.bufs - 1)
                    assert cta['staging'].get((wg, slot)) is None, \
                        f"cta{c} wg{wg} warp{w}: staging slot {slot} rewritten before its store was read"
                    yield
                    if w4 == 0:  # elected thread's warp: bulk_wait_read<bufs - 2>: all but the newest bufs - 2
                        older = [k for k in cta['issued'][wg][:len(cta['issued'][wg]) - (self.bufs - 2)]]
                        while any(k in cta['groups'][wg] for k in older): yield
                    yield from self.bar_sync(c, 2 + wg, 128)
                    if w4 == 0:
                        key = (box, slot)
                        cta['staging'][(wg, slot)] = 'pending'
                        cta['groups'][wg].append(key)
                        cta['issued'][wg].append(key)
                        self.events.append(self.store_group(c, wg, key))
                    box += 1

    def release(self, c, s):
        for d in range(self.csize):
            self.ctas[d]['empty'][s].arrive()

    def run(self, limit=300_000):
        live = list(self.agents)
        steps = 0
        while live or self.events:
            steps += 1
            if steps > limit:
                raise RuntimeError("step limit: hang")
            pool = live + self.events
            # try agents in random order until one makes progress (a generator step)
            g = self.r.choice(pool)
            try:
                next(g)
            except StopIteration:
                if g in live: live.remove(g)
                else: self.events.remove(g)
            # deadlock detection: every live agent blocked and no events
            if not self.events and steps % 5000 == 0:
                pass
        return steps

def runs_for(units, clusters, cl, m_groups):
    per, extra = divmod(units, clusters)
    ub = cl * per + min(cl, extra); ue = ub + per + (1 if cl < extra else 0)
    return [((u % m_groups), u // m_groups) for u in range(ub, ue)]


def protocol_checks(seeds):
    for seed in range(seeds):
        r = random.Random(seed)
        csize = r.choice([1, 2]); S = r.choice([2, 3, 4, 5]); kblocks = r.choice([1, 2, 3, 5, 8])
        bufs = r.choice([0, 2, 4]); m_groups = r.choice([1, 2, 3, 4]); n_tiles = r.choice([1, 2, 3])
        units = m_groups * n_tiles; clusters = min(r.choice([1, 2, 3]), units)
        runs = runs_for(units, clusters, r.randrange(clusters), m_groups)
        try:
            Sim(seed, csize, S, kblocks, runs, bufs, m_groups).run()
        except (AssertionError, RuntimeError) as e:
            print(f"seed {seed} csize={csize} S={S} kb={kblocks} bufs={bufs} runs={runs}: FAIL {e}")
            return False
    print(f"{seeds} randomized schedules: no race, no hang")
    return True

MUTATIONS = {
    "empty counts local arrivals only": ("empty=[Mbar(8 * csize,", "empty=[Mbar(8,"),
    "no remote release": ("for d in range(self.csize):\n            self.ctas[d]['empty'][s].arrive()",
                          "self.ctas[c]['empty'][s].arrive()"),
    "release before wait_group": ("for g in my_groups[:-1]): yield", "for g in my_groups[:-2]): yield"),
    "one pb barrier": ("                yield from self.bar_sync(c, 1, 256)\n                cta['pb'] = n",
                       "                cta['pb'] = n"),
    "store wait one buffer short": ("len(cta['issued'][wg]) - (self.bufs - 2)", "len(cta['issued'][wg]) - (self.bufs - 1)"),
    "wrong empty parity": ("bar = cta['empty'][s]; par = phase ^ 1", "bar = cta['empty'][s]; par = phase"),
    "expect_tx of own bytes only": ("expect=3 * 100 if self.csize == 2 else 300", "expect=200 if self.csize == 2 else 300"),
}

def mutation_checks():
    source = open(__file__).read()
    model, rest = source.split("\ndef protocol_checks(", 1)
    ok = True
    for name, (a, b) in MUTATIONS.items():
        assert model.count(a) == 1, f"mutation {name}: the model text moved"
        mutated = model.replace(a, b) + "\ndef protocol_checks(" + rest
        r = subprocess.run([sys.executable, "-", "150"], input=mutated, capture_output=True, text=True)
        caught = r.returncode != 0 and "FAIL" in r.stdout  # a race or hang the model saw, not a Python error
        ok &= caught
        print(f"  mutation {name:36s}: {'caught' if caught else 'MISSED'} {r.stdout.strip().splitlines()[-1][:110] if r.stdout.strip() else r.stderr[-200:]}")
    return ok

if __name__ == "__main__":
    seeds = int(next((a for a in sys.argv[1:] if a.isdigit()), "300"))
    layout_checks()
    ok = protocol_checks(seeds)
    if ok and "--mutations" in sys.argv:
        ok = mutation_checks()
    sys.exit(0 if ok else 1)
