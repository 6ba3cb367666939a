"""The main loop of a compiled kernel's SASS (cuobjdump's listing): its opcodes, spills and the path one warp
takes through it for a tile read the common way (bench/kernels/hopper_resources.py reports them)."""

from __future__ import annotations

import re


def opcode_counts(sass: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for m in re.finditer(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", sass):
        op = m.group(1).split(".")[0]
        counts[op] = counts.get(op, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: -kv[1]))


def instructions(sass: str) -> list[tuple[int, str]]:
    """(address, instruction text) of every instruction in the listing, in order."""
    return [(int(a, 16), t.strip()) for a, t in re.findall(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", sass)]


def loop_local_accesses(sass: str) -> int:
    """LDL/STL (spills) inside the main loop: between the target of the last backward branch and it. A
    spill outside the loop (a value kept across it) costs two accesses per program, not per tile."""
    insts = instructions(sass)
    head, tail = _main_loop(insts)
    return sum(1 for addr, txt in insts if head <= addr <= tail and re.search(r"\b(LDL|STL)", txt))


_BRA = re.compile(r"BRA (?:P\d, )?`?\(?0x([0-9a-f]+)")


def loops(insts: list[tuple[int, str]]) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """(every loop, those holding MMAs): each a backward branch's (first, last address)."""
    spans = [
        (int(m.group(1), 16), addr)
        for addr, txt in insts
        if (m := _BRA.search(txt)) and int(m.group(1), 16) < addr
    ]
    return spans, [(h, t) for h, t in spans if any(h <= a <= t and "HMMA" in txt for a, txt in insts)]


def _main_loop(insts: list[tuple[int, str]]) -> tuple[int, int]:
    """(first, last address) of the tile loop: the innermost loop (a backward branch's span) that holds
    the MMAs. An even-shares build wraps it in a loop over work items, whose span holds it."""
    every, with_mma = loops(insts)
    return min(with_mma or every or [(0, -1)], key=lambda span: span[1] - span[0])


def _loop_blocks(sass: str, span: tuple[int, int] | None = None) -> list[list[str]]:
    """The main loop's basic blocks (the last backward branch's body; or ``span``'s), each a list of
    instructions."""
    insts = instructions(sass)
    head, tail = span or _main_loop(insts)
    body = [(a, t) for a, t in insts if head <= a <= tail]
    targets = {int(m.group(1), 16) for _, t in body if (m := _BRA.search(t))}
    blocks: list[list[tuple[int, str]]] = [[]]
    for addr, txt in body:
        if addr in targets and blocks[-1]:
            blocks.append([])
        blocks[-1].append((addr, txt))
        if _BRA.search(txt):
            blocks.append([])
    return [[f"{a:x} {t}" for a, t in b] for b in blocks if b]


def _ops(block: list[str]) -> dict[str, int]:
    return opcode_counts("".join(f"/*{line.split()[0]:0>4}*/ {line.split(' ', 1)[1]};" for line in block))


def _paths(blocks: list[list[str]]) -> list[list[int]]:
    """Every way through a loop's blocks from its head to its backward branch (the loop's branches all go
    forward but the last; one out of the loop, an mbarrier wait's retry placed after the kernel, is taken
    rarely and not followed)."""
    first = {int(b[0].split()[0], 16): i for i, b in enumerate(blocks)}
    head = int(blocks[0][0].split()[0], 16)
    found: list[list[int]] = []

    def walk(i: int, path: list[int]) -> None:
        path = [*path, i]
        last = blocks[i][-1].split(" ", 1)[1]
        m = _BRA.search(last)
        if m and int(m.group(1), 16) == head:
            found.append(path)
        elif m and int(m.group(1), 16) in first:
            walk(first[int(m.group(1), 16)], path)
        if (not m or last.startswith("@")) and i + 1 < len(blocks):
            walk(i + 1, path)

    walk(0, [])
    return found


def _total(ops: list[dict[str, int]], path: list[int]) -> dict[str, int]:
    total: dict[str, int] = {}
    for j in path:
        for k, v in ops[j].items():
            total[k] = total.get(k, 0) + v
    return total


def coded_tile(sass: str) -> dict[str, object]:
    """Instructions one warp issues for a tile read the common way (every page coded: the coded copies of
    a tile ahead, the pre-pass, the attention), over each path through the main loop that takes those
    blocks and not the gather's: the fewest (a full tile; with the lazy rescale, its rescale skipped) and
    the most (a split's last tile, or rescaled), and the fewest by opcode."""
    blocks = _loop_blocks(sass)
    ops = [_ops(b) for b in blocks]
    found: list[tuple[int, dict[str, int], list[int], bool]] = []
    for path in _paths(blocks):
        # the pre-pass reads and writes shared memory outside the attention (MMAs, softmax exchanges); the
        # gather writes what it loaded
        attend = ("HMMA", "MUFU", "FMNMX")
        shared = [("LDS" in ops[j], "STS" in ops[j]) for j in path if not any(a in ops[j] for a in attend)]
        if (False, True) not in shared:
            total = _total(ops, path)
            found.append((total.get("LDGSTS", 0), total, path, (True, True) in shared))
    # the paths through a pre-pass, or where the producer warps run it (specialized.py's PREPASS) every path
    # that does not gather
    found = [f for f in found if f[3]] or found
    if not found:
        return {}
    most_copies = max(f[0] for f in found)  # the coded copies (the raw copies are fewer)
    paths = [(sum(f[1].values()), f[1], f[2]) for f in found if f[0] == most_copies]
    counts = sorted(paths, key=lambda x: x[0])
    phases: dict[str, int] = {}
    for j in counts[0][2]:
        phases[_phase(ops[j])] = phases.get(_phase(ops[j]), 0) + len(blocks[j])
    return {
        "fewest": counts[0][0],
        "most": counts[-1][0],
        "ops": dict(sorted(counts[0][1].items(), key=lambda kv: -kv[1])),
        "phases": phases,
    }


def _phase(ops: dict[str, int]) -> str:
    """What a block of the coded path does, by the instructions that only that phase issues."""
    if "LDGSTS" in ops:
        return "copies"
    if "LDG" in ops:
        return "table loads"
    if "LDSM" in ops:
        return "operands + QK"
    if "MUFU" in ops:
        return "softmax + PV"
    if "STS" in ops and "LDS" in ops:
        return "pre-pass"
    return "loop control"


def producer_loop(sass: str) -> dict[str, object]:
    """The producer partition's tile loop (hopper/specialized.py): the innermost loop that copies (LDGSTS)
    and multiplies nothing; its instructions in all, over every way through it, and by opcode, and its
    coded tile's way through it (:func:`_producer_coded_path`)."""
    insts = instructions(sass)
    every, with_mma = loops(insts)
    copying = [
        (h, t) for h, t in every
        if (h, t) not in with_mma and any(h <= a <= t and "LDGSTS" in x for a, x in insts)
    ]  # fmt: skip
    if not copying:
        return {}
    head, tail = min(copying, key=lambda span: span[1] - span[0])
    body = "".join(f"/*{a:04x}*/ {x};" for a, x in insts if head <= a <= tail)
    ops = opcode_counts(body)
    return {
        "instructions": sum(ops.values()),
        "ops": ops,
        "coded_path": _producer_coded_path(sass, (head, tail)),
    }


def _producer_coded_path(sass: str, span: tuple[int, int]) -> dict[str, object]:
    """A producer warp's way through its loop for a coded tile: the most copies (a coded tile's, both
    sides' planes and patches) and, where it runs the pre-pass (PREPASS), through it; the fewest
    instructions of those, and by opcode."""
    blocks = _loop_blocks(sass, span)
    ops = [_ops(b) for b in blocks]
    totals = [_total(ops, p) for p in _paths(blocks)]
    if not totals:
        return {}
    most = max(t.get("LDGSTS", 0) for t in totals)
    coded = [t for t in totals if t.get("LDGSTS", 0) == most]
    coded = [t for t in coded if "STS" in t] or coded
    fewest = min(coded, key=lambda t: sum(t.values()))
    return {"instructions": sum(fewest.values()), "ops": dict(sorted(fewest.items(), key=lambda kv: -kv[1]))}
