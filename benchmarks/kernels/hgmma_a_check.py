"""Checks SASS (cuobjdump -sass) for writes to the A registers of a register-A HGMMA while its wgmma group may still
be pending (PTX ISA, wgmma.wait_group: undefined behavior). Each loop body (a backward BRA) is walked twice, so the
back edge is covered, and the whole function once in address order, so the way out of a loop into the code after it
is too (a tail of wgmmas after the loop, say); a group retires at WARPGROUP.DEPBAR.LE gsb0, N.
Usage: hgmma_a_check.py x.sass"""
import re, sys

def width(op):
    if re.search(r"\.(128)\b", op): return 4
    if re.search(r"\.(64|WIDE)\b", op): return 2
    return 1

def parse(text):
    funcs, cur = {}, None
    for line in text.splitlines():
        m = re.search(r"Function : (\S+)", line)
        if m: cur = m.group(1); funcs[cur] = []; continue
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?);", line)
        if m and cur: funcs[cur].append((int(m.group(1), 16), m.group(2).strip()))
    return funcs

def check(insts):
    paths = [insts]  # the function in address order
    addr_index = {a: i for i, (a, _) in enumerate(insts)}
    for i, (a, ins) in enumerate(insts):
        m = re.search(r"BRA (0x[0-9a-f]+)", ins)
        if not m or int(m.group(1), 16) >= a: continue
        start = addr_index.get(int(m.group(1), 16))
        if start is None: continue
        paths.append(insts[start:i + 1] * 2)  # a loop body twice
    problems = []
    for body in paths:
        groups, open_regs = [], set()  # groups: list of sets of A registers, oldest first
        for addr, text in body:
            text = re.sub(r"^@!?U?P\w+\s+", "", text)
            op = text.split()[0]
            if op.startswith("HGMMA"):
                regs = re.findall(r"\bR(\d+)\b", text)
                # HGMMA Rd, Ra, gdesc, Rc: A register operand (4 regs) when the 2nd operand is a register
                ops = [o.strip() for o in text[len(op):].split(",")]
                if len(ops) > 1 and re.fullmatch(r"R\d+", ops[1]):
                    r0 = int(ops[1][1:]); open_regs |= set(range(r0, r0 + 4))
                if "gsb0" in text: groups.append(open_regs); open_regs = set()
                continue
            m2 = re.match(r"WARPGROUP\.DEPBAR\.LE gsb0, 0x(\d+)", text)
            if m2:
                keep = int(m2.group(1)); groups = groups[len(groups) - keep:] if keep else []
                continue
            m3 = re.match(r"[A-Z0-9_.]+\s+R(\d+)\b", text)
            if m3 and not op.startswith(("ST", "BAR", "LDGSTS", "RED", "ATOM")):
                r0 = int(m3.group(1)); written = set(range(r0, r0 + width(op)))
                pending = set().union(*groups) | open_regs if (groups or open_regs) else set()
                hit = written & pending
                if hit and (addr, text, sorted(hit)) not in problems: problems.append((addr, text, sorted(hit)))
    return problems

funcs = parse(open(sys.argv[1]).read())
bad = 0
for name, insts in funcs.items():
    p = check(insts)
    short = re.sub(r".*kernelI", "", name)[:40]
    print(f"{short:42s} {'HAZARD' if p else 'ok'} {len(p)} writes")
    for addr, text, regs in p[:3]: print(f"    {addr:05x} {text}  -> R{regs}")
    bad += bool(p)
sys.exit(1 if bad else 0)
