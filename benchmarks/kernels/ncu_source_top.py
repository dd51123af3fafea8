"""Where a kernel's time goes, instruction by instruction, from an ncu source page in CSV:

    ncu --section SourceCounters --page source --print-source sass --csv -k regex:NAME \
        --launch-skip 1 --launch-count 1 harness ROW graph=0 reps=1 > src.csv
    python3 benchmarks/kernels/ncu_source_top.py src.csv [TOP] [COLUMN]

prints the TOP (default 25) SASS lines by warp stall samples (all samples), each with its share of the samples and
its executed instructions, and the totals: what the sixth-to-twelfth sessions did by hand with a spreadsheet.
COLUMN (words of a header, e.g. "L1 Wavefronts Shared"; the first header holding all of them, not one that also says
"Excessive" or "Ideal" unless asked) ranks the lines by that column instead, printed beside each line with its total:
where a kernel's shared-memory wavefronts (or any source counter) come from.
gpu_session.sh's ncu stage runs it with NCU_SOURCE=1. A short kernel gets few samples a launch (the forty-second
session's 9 us W1A16 M = 1 kernel: 26): profile several launches (--launch-count N, reps=N) and the lines of every
launch's table are summed by address."""
import csv
import sys


def number(text):
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def main(path, top=25, rank_by=None):
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    header_at = next((i for i, r in enumerate(rows) if "Source" in r and any("Warp Stall Sampling" in c for c in r)),
                     None)
    if header_at is None:
        sys.exit(f"{path}: no source table (a header with Source and Warp Stall Sampling columns)")
    header = rows[header_at]

    def column(*words):
        return next((i for i, c in enumerate(header) if all(w in c for w in words)), None)

    source, samples = header.index("Source"), column("Warp Stall Sampling", "All")
    executed, address = column("Instructions Executed"), column("Address")
    if samples is None:
        samples = column("Warp Stall Sampling")
    ranked = None
    if rank_by:
        words = rank_by.split()
        others = [w for w in ("Excessive", "Ideal") if w not in words]
        ranked = next((i for i, c in enumerate(header) if all(w in c for w in words) and not any(o in c for o in others)),
                      None)
        if ranked is None:
            sys.exit(f"{path}: no column holding {rank_by!r} (headers: {', '.join(header)})")
    # every launch's table (the header repeats before each): one line an address (or a source text), summed
    lines = {}
    for r in rows[header_at + 1:]:
        if len(r) != len(header) or r == header:
            continue
        key = r[address] if address is not None else r[source]
        line = lines.setdefault(key, [r[source].strip(), 0.0, 0.0, 0.0])
        line[1] += number(r[samples])
        line[2] += number(r[executed]) if executed is not None else 0.0
        line[3] += number(r[ranked]) if ranked is not None else 0.0
    total = sum(line[1] for line in lines.values()) or 1.0
    total_executed = sum(line[2] for line in lines.values())
    summary = f"{len(lines)} SASS lines, {total:.0f} stall samples, {total_executed:.0f} instructions executed"
    if ranked is not None:
        total_ranked = sum(line[3] for line in lines.values())
        summary += f", {total_ranked:.0f} {header[ranked]}"
    print(summary)
    order = 3 if ranked is not None else 1
    for key, (text, count, runs, value) in sorted(lines.items(), key=lambda item: -item[1][order])[:top]:
        where = key if address is not None else ""
        runs_text = f"{runs:>12.0f}" if executed is not None else ""
        value_text = f"{value:>10.0f}  " if ranked is not None else ""
        print(f"{100 * count / total:6.2f}%  {value_text}{runs_text}  {where:>6}  {text[:110]}")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 25, sys.argv[3] if len(sys.argv) > 3 else None)
