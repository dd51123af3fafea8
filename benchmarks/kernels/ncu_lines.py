"""A kernel's warp stall samples by source line and by phase, with their stall reasons: ncu's source page (SASS, CSV)
joined to sass.sh's line info by each instruction's offset in the kernel.

    bash benchmarks/kernels/sass.sh binary_conv2d_wgmma binary_conv2d_wgmma_kernelI6__half # here: the SASS with lines
    (on the device) gpu_session.sh ncu with NCU_SOURCE=1 -> $OUT/ncu/src_ROW.csv         # the source page
    python3 benchmarks/kernels/ncu_lines.py SRC.csv SASS FILE.cu FIRST LAST [PHASES] [--lines PHASE]

An instruction counts against the innermost line of FILE.cu in FIRST..LAST (the kernel's body: an inlined helper's
instructions go to its call site there, a lambda's to its own lines); PHASES, e.g. "setup:1513-1575,loop:1681-1755",
names line ranges. Prints each phase's share of the samples with its top stall reasons, then (--lines PHASE, or all)
its busiest lines. The launches ncu profiled (--launch-count N) are summed by offset, so a short kernel gets enough
samples. The SASS must be the same compilation as the binary ncu ran (same flags; -lineinfo does not change it):
the instruction counts must match, which is checked. The fifty-first session's use: what held the wgmma conv at
B = 64 (its NOTES section)."""
import collections
import csv
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ncu_source_top import number  # noqa: E402  (the CSV's numbers, "1,234" included)


def sass_lines(path, source, first, last):
    """offset -> line of `source` in first..last (innermost), from nvdisasm -gi output."""
    lines, block, in_block = {}, [], False
    for text in open(path):
        m = re.search(r'//## File "([^"]+)", line (\d+)', text)
        if m:
            if not in_block:
                block, in_block = [], True
            if m.group(1).endswith(source):
                block.append(int(m.group(2)))
            continue
        in_block = False
        m = re.match(r"\s+/\*([0-9a-f]+)\*/\s+\S", text)
        if m:
            inside = [line for line in block if first <= line <= last]
            lines[int(m.group(1), 16)] = inside[0] if inside else None
    return lines


def source_sections(path):
    """The CSV's tables (one a profiled launch): (header, rows of instructions)."""
    sections, header, rows = [], None, None
    for row in csv.reader(open(path, newline="")):
        if row and row[0] == "Address" and "Source" in row:
            header, rows = row, []
            sections.append((header, rows))
        elif rows is not None and row and row[0].startswith("0x"):
            rows.append(row)
    return sections


def main(argv):
    if len(argv) < 5:
        print(__doc__)
        return 2
    csv_path, sass_path, source, first, last = argv[0], argv[1], argv[2], int(argv[3]), int(argv[4])
    rest = argv[5:]
    show = None
    if "--lines" in rest:
        show = rest[rest.index("--lines") + 1]
        rest = rest[: rest.index("--lines")]
    phases = []
    for item in (rest[0].split(",") if rest else []):
        name, span = item.split(":")
        a, b = span.split("-")
        phases.append((name, int(a), int(b)))
    line_of = sass_lines(sass_path, source, first, last)
    sections = source_sections(csv_path)
    if not sections:
        print(f"ncu_lines: no source table in {csv_path}")
        return 1
    if len(sections[0][1]) != len(line_of):
        print(f"ncu_lines: {len(sections[0][1])} instructions profiled, {len(line_of)} in {sass_path}: "
              "not the same compilation")
        return 1
    header = sections[0][0]
    col = {h: i for i, h in enumerate(header)}
    reasons = [h for h in header if h.startswith("stall_") and "Not Issued" not in h]
    by_offset = collections.defaultdict(collections.Counter)
    for _, rows in sections:
        base = int(rows[0][0], 16)
        for r in rows:
            c = by_offset[int(r[0], 16) - base]
            c["samples"] += number(r[col["Warp Stall Sampling (All Samples)"]])
            c["executed"] += number(r[col["Instructions Executed"]])
            for reason in reasons:
                c[reason] += number(r[col[reason]])
    total = sum(c["samples"] for c in by_offset.values()) or 1.0

    def phase_of(line):
        for name, a, b in phases:
            if line is not None and a <= line <= b:
                return name
        return "other" if phases else str(line)

    def row_text(label, c, top):
        best = sorted(((c[r], r) for r in reasons), reverse=True)[:top]
        return (f"{label:>12} {100 * c['samples'] / total:6.2f}%  executed {int(c['executed']):10d}  "
                + "  ".join(f"{r[6:]} {100 * v / total:.1f}" for v, r in best if v > 0))

    print(f"{len(sections)} launches, {int(total)} samples, {len(line_of)} instructions; % of all samples")
    groups = collections.defaultdict(collections.Counter)
    for offset, c in by_offset.items():
        groups[phase_of(line_of.get(offset))].update(c)
    everything = collections.Counter()
    for c in groups.values():
        everything.update(c)
    print(row_text("all", everything, 8))
    if phases:
        for name, c in sorted(groups.items(), key=lambda kv: -kv[1]["samples"]):
            print(row_text(name, c, 6))
    lines = collections.defaultdict(collections.Counter)
    for offset, c in by_offset.items():
        line = line_of.get(offset)
        if show is None or phase_of(line) == show:
            lines[line].update(c)
    print(f"lines{' of ' + show if show else ''}, busiest first:")
    for line, c in sorted(lines.items(), key=lambda kv: -kv[1]["samples"])[:30]:
        print(row_text(str(line), c, 4))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
