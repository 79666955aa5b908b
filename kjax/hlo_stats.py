"""FLOPs, HBM bytes and interconnect bytes of a compiled HLO module's text, loops counted
per trip.

XLA's `compiled.cost_analysis()` counts a while loop's body once, so a `lax.scan` over 32
layers inside 8 microbatches reports 1/256 of the work. `module_stats(hlo_text)` walks the
call graph instead: a scan body counts (trip count) times, the trip count read from its
condition (`i < constant(n)`); a loop whose condition has no constant bound (a
`lax.while_loop` that stops early) counts once and is listed in `unbounded_loops`.

- flops: 2 x multiply-adds of every dot and convolution (in fusions too), and of each
  Pallas kernel (`tpu_custom_call`) what a `kernel_cost` hook or the kernel's own
  cost estimate says (else 0, counted in `uncosted_kernels`).
- bytes: HBM traffic as the chip moves it. Per top-level instruction (not inside a
  fusion), its result plus operands, counting only arrays in HBM (layout memory space 0:
  an `S(1)` array is in on-chip VMEM); a slice, and a fusion operand only sliced inside,
  count as their slices; an in-place dynamic-update-slice (a fusion's root or one output of a
  multi-output fusion) writes its update and does not read its buffer; a memory-space-
  assignment prefetch (`copy-start`, `slice-start`) moves its destination once on each
  HBM side; `AllocateBuffer` moves nothing.
- collectives: {kind: (count, bytes of their results)}; `ici`: bytes each chip sends
  over the interconnect per group kind (ring algorithms: (n-1)/n of an all-gather's
  result, 2 (n-1)/n of an all-reduce's), keyed by `group_key(replica group)`, e.g. the
  mesh axes the group spans.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections import defaultdict

import numpy as np

COLLECTIVES = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all", "collective-permute")
_BITS = {"pred": 8, "s4": 4, "u4": 4, "s8": 8, "u8": 8, "s16": 16, "u16": 16, "bf16": 16,
         "f16": 16, "s32": 32, "u32": 32, "f32": 32, "s64": 64, "u64": 64, "f64": 64,
         "f8e4m3fn": 8, "f8e5m2": 8}  # fmt: skip
_ARRAY = re.compile(r"\b(" + "|".join(_BITS) + r")\[([\d,]*)\](\{[^}]*\})?")
_HEADER = re.compile(r"^(?:ENTRY )?%([\w.\-]+) \(.*\) -> .* \{$")
_FREE = {"parameter", "get-tuple-element", "tuple", "constant", "bitcast", "while", "call",
         "conditional", "after-all", "partition-id", "replica-id", "opt-barrier", "copy-done",
         "all-reduce-done", "all-gather-done", "collective-permute-done", "send-done",
         "recv-done"}  # fmt: skip
_SLICES = {"dynamic-slice", "slice", "gather"}
_NO_TRAFFIC = {"AllocateBuffer"}  # custom-call targets that reserve memory and move nothing


@dataclasses.dataclass
class _Instr:
    name: str
    type: str
    op: str
    operands: list[str]
    args: str  # the text between the opcode's parentheses (a constant's literal, ...)
    attrs: str


def _arrays(type_str: str) -> list[tuple[str, list[int]]]:
    return [(t, [int(d) for d in dims.split(",") if d]) for t, dims, _ in _ARRAY.findall(type_str)]


def _bytes(type_str: str) -> int:
    """Bytes of every array of a type, wherever it lives."""
    return sum(math.prod(dims) * _BITS[t] // 8 for t, dims in _arrays(type_str))


def _hbm(type_str: str) -> int:
    """Bytes of the arrays of a type that live in HBM: layout memory space 0 (no `S(n)`;
    S(1) is VMEM, S(2) sync flags, higher spaces other on-chip or host memories)."""
    total = 0
    for t, dims, layout in _ARRAY.findall(type_str):
        space = re.search(r"S\((\d+)\)", layout)
        if space is None or space.group(1) == "0":
            total += math.prod(int(d) for d in dims.split(",") if d) * _BITS[t] // 8
    return total


def _elements(type_str: str) -> list[str]:
    """The top-level elements of a tuple type "(a, (b, c), d)" (the type itself when it
    is not a tuple)."""
    type_str = re.sub(r"/\*.*?\*/", "", type_str).strip()
    if not type_str.startswith("("):
        return [type_str]
    out, depth, start = [], 0, 1
    for i, ch in enumerate(type_str[1:-1], 1):
        depth += {"(": 1, "[": 1, "{": 1, ")": -1, "]": -1, "}": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            out.append(type_str[start:i].strip())
            start = i + 1
    out.append(type_str[start:-1].strip())
    return [e for e in out if e]


def _close(text: str, start: int) -> int:
    """Index just past the parenthesis matching text[start] == '('."""
    depth = 0
    for i in range(start, len(text)):
        depth += {"(": 1, ")": -1}.get(text[i], 0)
        if depth == 0:
            return i + 1
    return len(text)


def _parse_instr(line: str) -> _Instr | None:
    m = re.match(r"^\s*(?:ROOT )?%([\w.\-]+) = ", line)
    if not m:
        return None
    rest = line[m.end() :]
    if rest.startswith("("):
        end = _close(rest, 0)
        type_str, rest = rest[:end], rest[end:].lstrip()
    else:
        type_str, _, rest = rest.partition(" ")
    op_m = re.match(r"([\w\-]+)\(", rest)
    if not op_m:
        return None
    end = _close(rest, op_m.end() - 1)
    args = rest[op_m.end() : end - 1]
    operands = re.findall(r"%([\w.\-]+)", args)
    return _Instr(m.group(1), type_str, op_m.group(1), operands, args, rest[end:])


_STARTS = re.compile(r"^\s*(?:ROOT )?%[\w.\-]+ = |^(?:ENTRY )?%[\w.\-]+ \(|^\}\s*$|^HloModule")


def _lines(hlo_text: str) -> list[str]:
    """The module's logical lines: an instruction whose attributes span several text
    lines (a Pallas kernel's `kernel_metadata`, whose continuation may start with "}")
    joined into one."""
    out: list[str] = []
    for line in hlo_text.splitlines():
        if out and not _STARTS.match(line) and line.strip():
            out[-1] += line
        else:
            out.append(line)
    return out


def _parse(hlo_text: str):
    """{computation: [instr]}, its ROOT names, the entry's name."""
    comps, roots, entry, current = {}, {}, None, None
    for line in _lines(hlo_text):
        header = _HEADER.match(line)
        if header:
            current = header.group(1)
            comps[current] = []
            entry = current if line.startswith("ENTRY") else entry
            continue
        if current is None or line.startswith("}"):
            current = None if line.startswith("}") else current
            continue
        instr = _parse_instr(line)
        if instr:
            comps[current].append(instr)
            if line.lstrip().startswith("ROOT"):
                roots[current] = instr.name
    return comps, roots, entry


def _int_constant(instr: _Instr | None) -> int | None:
    if instr is not None and instr.op == "constant" and re.fullmatch(r"-?\d+", instr.args.strip()):
        return int(instr.args)
    return None


def _tuple_index(name: str, by_name) -> int | None:
    """The tuple index of a get-tuple-element (through copies), else None."""
    instr = by_name.get(name)
    while instr is not None and instr.op in ("copy", "convert", "bitcast") and instr.operands:
        instr = by_name.get(instr.operands[0])
    if instr is None or instr.op != "get-tuple-element":
        return None
    m = re.search(r"index=(\d+)", instr.attrs)
    return int(m.group(1)) if m else None


def _trip_count(instr: _Instr, comps, by_name) -> int | None:
    """Iterations of a while loop `for (i = start; i < limit; i += step)`: limit from its
    condition, step from its body's update of i, start from its initial tuple (0 when not
    a constant there). None when the condition is not such a bound (an early stop)."""
    known = re.search(r'"known_trip_count":\{"n":"(\d+)"', instr.attrs)
    if known:
        return int(known.group(1))
    cond = re.search(r"condition=%([\w.\-]+)", instr.attrs)
    body = re.search(r"body=%([\w.\-]+)", instr.attrs)
    cond_instrs = comps.get(cond.group(1), []) if cond else []
    compares = [i for i in cond_instrs if i.op == "compare" and "direction=LT" in i.attrs]
    if len(compares) != 1 or any(i.op in ("and", "or", "not") for i in cond_instrs):
        return None
    lhs, rhs = (compares[0].operands + [None, None])[:2]
    limit, index = _int_constant(by_name.get(rhs)), _tuple_index(lhs, by_name)
    if limit is None or index is None:
        return None
    step, start = 1, 0
    root = (
        next((i for i in comps.get(body.group(1), []) if i.op == "tuple"), None) if body else None
    )
    roots = [i for i in comps.get(body.group(1), []) if i.op == "tuple"] if body else []
    root = roots[-1] if roots else root
    if root is not None and index < len(root.operands):
        update = by_name.get(root.operands[index])
        if update is not None and update.op == "add":
            for operand in update.operands:
                value = _int_constant(by_name.get(operand))
                step = value if value else step
    init = by_name.get(instr.operands[0]) if instr.operands else None
    if init is not None and init.op == "tuple" and index < len(init.operands):
        value = _int_constant(by_name.get(init.operands[index]))
        start = value if value is not None else 0
    return max(0, -(-(limit - start) // max(step, 1)))


def computations(hlo_text: str) -> dict[str, list[_Instr]]:
    """Each computation of a compiled module's HLO text and its instructions (name, type,
    op, operand names, attributes), in text order."""
    return _parse(hlo_text)[0]


@dataclasses.dataclass(frozen=True)
class Kernel:
    """One Pallas kernel call (`tpu_custom_call`) as the HLO shows it: `name` is the
    pallas_call's name (e.g. "splash_mha_fwd_no_residuals"), `operands` and `result`
    HLO types ("bf16[4,512,128]{...}"), `op_name` its JAX op name."""

    name: str
    operands: tuple[str, ...]
    result: str
    op_name: str


@dataclasses.dataclass(frozen=True)
class KernelCost:
    flops: float
    bytes: float  # HBM bytes one call moves


@dataclasses.dataclass(frozen=True)
class ModuleStats:
    flops: float
    bytes: float
    collectives: dict[str, tuple[int, int]]
    unbounded_loops: int
    ici: dict[str, float] = dataclasses.field(default_factory=dict)  # bytes sent per chip
    uncosted_kernels: int = 0  # Pallas kernel calls with no cost (their FLOPs counted as 0)


def _dot_flops(instr: _Instr, shapes) -> float:
    out = _arrays(instr.type)
    if not out or not instr.operands:
        return 0.0
    size = math.prod(out[0][1])
    if instr.op == "dot":
        lhs = _arrays(shapes.get(instr.operands[0], ""))
        dims = re.search(r"lhs_contracting_dims=\{([\d,]*)\}", instr.attrs)
        if not lhs or not dims:
            return 0.0
        contract = math.prod(lhs[0][1][int(d)] for d in dims.group(1).split(",") if d)
        return 2.0 * size * contract
    return _conv_flops(instr, shapes, size)


def _window(attrs: str, key: str, n: int, default: int) -> list[list[int]]:
    m = re.search(rf"\b{key}=([\d_x]+)", attrs.split("dim_labels")[0])
    if not m:
        return [[default, default]] * n if key == "pad" else [[default]] * n
    return [[int(v) for v in part.split("_")] for part in m.group(1).split("x")]


def _conv_flops(instr: _Instr, shapes, out_size: int) -> float:
    """2 x (output elements) x (input features per group) x (valid kernel taps), as XLA
    counts a convolution: the SPMD partitioner writes a windowed (collective) matmul as a
    convolution whose padded or dilated window leaves some taps on padding."""
    labels = re.search(r"dim_labels=(\w+)_(\w+)->(\w+)", instr.attrs)
    if not labels or len(instr.operands) < 2:
        return 0.0
    lhs_l, rhs_l, out_l = labels.groups()
    lhs = _arrays(shapes.get(instr.operands[0], ""))
    rhs = _arrays(shapes.get(instr.operands[1], ""))
    out = _arrays(instr.type)
    if not lhs or not rhs or not out:
        return 0.0
    lhs, rhs, out = lhs[0][1], rhs[0][1], out[0][1]
    spatial = sorted(c for c in lhs_l if c.isdigit())
    n = len(spatial)
    sizes = _window(instr.attrs, "size", n, 1)
    pads = _window(instr.attrs, "pad", n, 0)
    strides = _window(instr.attrs, "stride", n, 1)
    lhs_dil = _window(instr.attrs, "lhs_dilate", n, 1)
    rhs_dil = _window(instr.attrs, "rhs_dilate", n, 1)
    taps = 1
    for d, c in enumerate(spatial):
        size_in, size_out = lhs[lhs_l.index(c)], out[out_l.index(c)]
        kernel = rhs[rhs_l.index(c)] if len(sizes[d]) != 1 else sizes[d][0]
        o = np.arange(size_out)[:, None]
        k = np.arange(kernel)[None, :]
        pos = o * strides[d][0] + k * rhs_dil[d][0] - pads[d][0]
        dil = lhs_dil[d][0]
        valid = (pos >= 0) & (pos <= (size_in - 1) * dil) & (pos % dil == 0)
        taps *= int(valid.sum())
    batch_features = out[out_l.index("b")] * out[out_l.index("f")]
    return 2.0 * batch_features * rhs[rhs_l.index("i")] * taps


def _operand_bytes(comp: str, index: int, comps, shapes, full: int) -> int:
    """HBM bytes a fusion reads of its operand `index` (`full` when all of it): its
    slices when only sliced inside, nothing when only the buffer of an in-place
    dynamic-update-slice."""
    params = [i for i in comps.get(comp, []) if i.op == "parameter"]
    param = next((p for p in params if p.args.strip() == str(index)), None)
    if param is None:
        return full
    users = [i for i in comps[comp] if param.name in i.operands]
    total = 0
    for user in users:
        if user.op in _SLICES and user.operands[0] == param.name:
            total += _bytes(user.type)
        elif user.op == "dynamic-update-slice" and user.operands[0] == param.name:
            continue  # written in place: the buffer is not read
        elif user.op == "bitcast":
            total += _operand_users_bytes(comp, user.name, comps, shapes, full)
        elif user.op == "fusion":
            called = re.search(r"calls=%([\w.\-]+)", user.attrs)
            inner = user.operands.index(param.name)
            total += _operand_bytes(called.group(1), inner, comps, shapes, full) if called else full
        else:
            return full
    return min(total, full)


def _operand_users_bytes(comp: str, name: str, comps, shapes, full: int) -> int:
    """_operand_bytes for a bitcast of a fusion parameter: what its users read (all of
    it when it is the fusion's result)."""
    users = [i for i in comps[comp] if name in i.operands]
    if not users:
        return full
    total = 0
    for user in users:
        if user.op in _SLICES and user.operands[0] == name:
            total += _bytes(user.type)
        elif user.op == "dynamic-update-slice" and user.operands[0] == name:
            continue
        else:
            return full
    return total


def _replica_groups(attrs: str) -> list[tuple[int, ...]]:
    """The device groups of a collective: explicit `{{0,1},{2,3}}`, iota
    `[2,2]<=[2,2]T(1,0)`, mesh `mesh['a'=2,'b'=2] {'b'}`, or a permute's
    `source_target_pairs` (each pair a group). [] when the groups are not written."""
    pairs = re.search(r"source_target_pairs=\{((?:\{\d+,\d+\},?)*)\}", attrs)
    if pairs:
        return [tuple(map(int, p)) for p in re.findall(r"\{(\d+),(\d+)\}", pairs.group(1))]
    iota = re.search(r"replica_groups=\[([\d,]+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?", attrs)
    if iota:
        shape, dims = [[int(x) for x in g.split(",")] for g in iota.groups()[:2]]
        ids = np.arange(math.prod(dims)).reshape(dims)
        if iota.group(3):
            ids = ids.transpose([int(x) for x in iota.group(3).split(",")])
        return [tuple(map(int, g)) for g in ids.reshape(shape[0], -1)]
    mesh = re.search(r"replica_groups=mesh\[([^\]]*)\]\s*\{([^}]*)\}", attrs)
    if mesh:
        axes = re.findall(r"'([^']+)'=(\d+)", mesh.group(1))
        names, sizes = [a for a, _ in axes], [int(n) for _, n in axes]
        group_axes = [names.index(a) for a in re.findall(r"'([^']+)'", mesh.group(2))]
        ids = np.arange(math.prod(sizes)).reshape(sizes)
        rest = [i for i in range(len(sizes)) if i not in group_axes]
        size = math.prod(sizes[i] for i in group_axes)
        return [tuple(map(int, g)) for g in ids.transpose(rest + group_axes).reshape(-1, size)]
    explicit = re.search(r"replica_groups=\{((?:\{[\d,]*\},?)*)\}", attrs)
    if explicit:
        found = re.findall(r"\{([\d,]+)\}", explicit.group(1))
        return [tuple(map(int, g.split(","))) for g in found]
    return []


def _wire_bytes(kind: str, size: int, groups: list[tuple[int, ...]]) -> float:
    """Bytes one chip sends for a collective of result `size` over `groups` (ring
    algorithms; a permute sends its result unless every pair is a chip to itself)."""
    if kind == "collective-permute":
        return float(size) if any(a != b for a, b in groups) else 0.0
    n = len(groups[0]) if groups else 1
    if n <= 1:
        return 0.0
    share = (n - 1) / n
    if kind == "all-reduce":
        return 2 * share * size
    if kind == "reduce-scatter":
        return share * n * size  # the operand is n results
    return share * size


def _kernel(instr: _Instr, shapes, kernel_cost) -> tuple[KernelCost, bool]:
    """(cost, known) of a Pallas kernel call: the hook's, else the kernel's own
    cost_estimate, else 0 FLOPs and its operands and result read and written once."""
    op_name = re.search(r'op_name="([^"]*)"', instr.attrs)
    op_name = op_name.group(1) if op_name else ""
    parts = op_name.split("/")
    name = parts[-2] if len(parts) >= 2 and parts[-1] == "pallas_call" else instr.name
    operands = tuple(shapes.get(o, "") for o in instr.operands)
    moved = _hbm(instr.type) + sum(_hbm(t) for t in operands)
    if kernel_cost is not None:
        cost = kernel_cost(Kernel(name, operands, instr.type, op_name))
        if cost is not None:
            return cost, True
    estimate = re.search(
        r'"cost_estimate":\{"flops":"(\d+)"[^}]*"bytes_accessed":"(\d+)"', instr.attrs
    )
    if estimate:
        flops, accessed = int(estimate.group(1)), int(estimate.group(2))
        return KernelCost(float(flops), float(accessed or moved)), True
    return KernelCost(0.0, float(moved)), False


def _target(instr: _Instr) -> str:
    m = re.search(r'custom_call_target="([^"]*)"', instr.attrs)
    return m.group(1) if m else ""


def module_stats(hlo_text: str, per_trip: bool = True, *, group_key=None,
                 kernel_cost=None) -> ModuleStats:  # fmt: skip
    """Trip-count-weighted FLOPs, HBM bytes and collectives of one compiled HLO module
    (per_trip=False: every loop body once, as XLA's cost_analysis counts them).

    group_key(group: tuple of partition ids) -> str names the interconnect bucket of a
    collective's replica group (default: its size, "4 chips"); kernel_cost(Kernel) ->
    KernelCost | None costs a Pallas kernel call (None: its own estimate or 0 FLOPs)."""
    comps, roots, entry = _parse(hlo_text)
    by_name = {i.name: i for body in comps.values() for i in body}
    shapes = {name: i.type for name, i in by_name.items()}
    mult: dict[str, float] = defaultdict(float)
    fused: set[str] = set()
    mult[entry] = 1.0
    unbounded = 0
    # HLO text lists callees before callers: walk it backwards so callers are done first.
    for comp in reversed(list(comps)):
        m = mult.get(comp, 0.0)
        if not m:
            continue
        for instr in comps[comp]:
            if instr.op == "while":
                trips = _trip_count(instr, comps, by_name)
                unbounded += trips is None
                body = re.search(r"body=%([\w.\-]+)", instr.attrs)
                if body:
                    mult[body.group(1)] += m * ((trips or 1) if per_trip else 1)
            elif instr.op == "conditional":
                for callee in re.findall(r"%([\w.\-]+)", instr.attrs.split("metadata=")[0]):
                    if callee in comps:
                        mult[callee] += m
            elif instr.op in ("fusion", "call", "async-start", "custom-call"):
                for callee in re.findall(r"(?:calls|to_apply)=%([\w.\-]+)", instr.attrs):
                    mult[callee] += m
                    if instr.op == "fusion":
                        fused.add(callee)
    flops, traffic, uncosted = 0.0, 0.0, 0
    coll = {kind: [0.0, 0.0] for kind in COLLECTIVES}
    ici: dict[str, float] = defaultdict(float)
    for comp, body in comps.items():
        m = mult.get(comp, 0.0)
        if not m:
            continue
        for instr in body:
            if instr.op in ("dot", "convolution"):
                flops += m * _dot_flops(instr, shapes)
            kind = instr.op.removesuffix("-start")
            if kind in coll:
                arrays = _arrays(instr.type)
                size = _bytes(instr.type)
                if instr.op.endswith("-start") and kind in ("all-gather", "collective-permute"):
                    size = max(math.prod(d) * _BITS[t] // 8 for t, d in arrays)
                coll[kind][0] += m
                coll[kind][1] += m * size
                groups = _replica_groups(instr.attrs)
                wire = _wire_bytes(kind, size, groups) if groups else 0.0
                if wire:  # not a group of one chip, nor a permute of each chip to itself
                    group = next((g for g in groups if len(set(g)) > 1), groups[0])
                    key = group_key(group) if group_key else f"{len(group)} chips"
                    ici[key] += m * wire
            if comp in fused or instr.op in _FREE or instr.op.endswith("-done"):
                continue
            if instr.op == "custom-call" and _target(instr) == "tpu_custom_call":
                cost, known = _kernel(instr, shapes, kernel_cost)
                flops += m * cost.flops
                traffic += m * cost.bytes
                uncosted += m * (not known)
                continue
            traffic += m * _instr_bytes(instr, comps, roots, shapes)
    return ModuleStats(
        flops=flops,
        bytes=traffic,
        collectives={k: (int(c), int(b)) for k, (c, b) in coll.items()},
        unbounded_loops=unbounded,
        ici=dict(ici),
        uncosted_kernels=int(uncosted),
    )


def _start_bytes(instr: _Instr, shapes) -> int | None:
    """HBM bytes of an asynchronous start whose result tuple echoes its operand: a
    prefetch or eviction (`copy-start`: (destination, source, context); `slice-start`:
    ((source), destination, context)) moves its destination once on each side in HBM;
    an all-gather / permute start reads its operand and writes its result."""
    parts = _elements(instr.type)
    operands = [shapes.get(o, "") for o in instr.operands]
    if instr.op == "copy-start" and len(parts) >= 2:
        return _hbm(parts[0]) + sum(_hbm(t) for t in operands)
    if instr.op == "slice-start" and len(parts) >= 2:
        read = _bytes(parts[1]) if any(_hbm(t) for t in operands) else 0
        return _hbm(parts[1]) + read
    if instr.op in ("all-gather-start", "collective-permute-start") and len(parts) >= 2:
        return _hbm(parts[1]) + sum(_hbm(t) for t in operands)
    return None


def _in_place_write(root: _Instr | None, by_name, out_type: str) -> int:
    """HBM bytes a fusion output of type `out_type` writes, produced by `root` inside
    the fusion: an in-place dynamic-update-slice writes only its update."""
    while root is not None and root.op == "bitcast" and root.operands:
        root = by_name.get(root.operands[0])
    if root is not None and root.op == "dynamic-update-slice" and _hbm(out_type):
        return _bytes(by_name[root.operands[1]].type) if root.operands[1] in by_name else 0
    return _hbm(out_type)


def _instr_bytes(instr: _Instr, comps, roots, shapes) -> int:
    if instr.op == "custom-call" and _target(instr) in _NO_TRAFFIC:
        return 0
    started = _start_bytes(instr, shapes) if instr.op.endswith("-start") else None
    if started is not None:
        return started
    if instr.op in ("slice", "dynamic-slice") and instr.operands:
        # Reads its slice of the operand, not the whole (the decode's window of the
        # own K/V cache, sliced into VMEM: counted whole, 64x the read at window 16).
        read = _bytes(instr.type) if _hbm(shapes.get(instr.operands[0], "")) else 0
        rest = sum(_hbm(shapes.get(o, "")) for o in instr.operands[1:])  # start indices
        return _hbm(instr.type) + read + rest
    if instr.op == "dynamic-update-slice" and len(instr.operands) > 1:
        update = shapes.get(instr.operands[1], "")  # in place: read and write the update
        return _hbm(update) + (_bytes(update) if _hbm(instr.type) else 0)
    if instr.op != "fusion":
        return _hbm(instr.type) + sum(_hbm(shapes.get(o, "")) for o in instr.operands)
    called = re.search(r"calls=%([\w.\-]+)", instr.attrs)
    comp = called.group(1) if called else ""
    inside = {i.name: i for i in comps.get(comp, [])}
    root = inside.get(roots.get(comp, ""))
    outputs = _elements(instr.type)
    if root is not None and root.op == "tuple" and len(root.operands) == len(outputs):
        out = sum(
            _in_place_write(inside.get(o), inside, t)
            for o, t in zip(root.operands, outputs, strict=True)
        )
    else:
        out = _in_place_write(root, inside, instr.type)
    reads = sum(
        _operand_bytes(comp, k, comps, shapes, _hbm(shapes.get(o, "")))
        for k, o in enumerate(instr.operands)
    )
    return out + reads
