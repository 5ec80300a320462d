"""What a persistent MTP pass would cost: one cooperative kernel for a whole draft pass, its phases
separated by grid barriers, the GEMV phases running the engine's own GEMV code.

Issue #16's K = 3 draft goal (among 32,768 ids) lacks ~77 µs on the H100 (0.787 ms against
0.710). A pass's GEMVs already stream at about the copy rate; its ~11 small kernels and 17 kernel
boundaries cost ~49 µs a pass in the graph (``tools/probe_marginal.py --step draft``). This probe
builds the pass as ``patches/README.md`` plans it, far enough to time it, before the engine is
changed:

- **the GEMV phases are the engine's GEMV**: the source :func:`numba_kernels.linear.gemv_source`
  writes for the one-row configuration the pass's six shapes share (bench-8l: fc, q‖gate‖k‖v, o,
  gate‖up, down and the lm head's first ``--draft-vocab`` rows), turned into a device function of
  the block index that every block of the cooperative grid calls for the output blocks
  ``blockIdx.x, blockIdx.x + gridDim.x, ...``; shared memory is declared once by the kernel. With
  the small phases off every GEMV phase reads an input no phase writes, and each phase's outputs
  are checked bitwise against ``numba_kernels.cuda.gemv`` on that input: the arithmetic (the
  canonical dot) is the engine's, whatever the grid;
- **the small phases are stand-ins** with the shape of the engine's (the work, not the
  arithmetic): one block normalising a row (the MTP head's two input norms, the layer's norms,
  the residual adds), a block per 64-key tile and KV head reading its keys and values, then a
  block per query head folding the tiles (attention), a SwiGLU over the MLP's width, and the
  greedy pick's two levels (a block per 1,024 logits, then one block);
- one grid barrier (``cuda.cg.this_grid().sync()``) after each of the 16 phases, where the
  graph has a kernel boundary after each of a pass's 17 kernels.

Prints and writes (JSON) the median of ``--reps`` timed runs (CUDA events) for 1 and 2 blocks an
SM (where the cooperative launch allows them), each with the barrier before a GEMV phase after
the phase's first weight loads (``prefetch``: the GEMV's PDL build, the barrier in place of its
``pdl_wait()``) and without:
the whole pass (``pass_us``), the same kernel with the small phases skipped (``gemv_phases_us``:
the GEMVs and their barriers) and the six GEMVs as six launches of the engine's kernel
(``gemv_launches_us``: captured in one CUDA graph as a step captures them, replayed: the rate
the engine streams the same bytes at). Against the engine's replayed pass (``probe_marginal.py
--step draft``'s ``base_us``, ~237-240 µs on an H100), ``pass_us`` says what a persistent pass
could take off a draft step. The kernel's registers a thread and the blocks a cooperative
launch may have go with them (``regs_per_thread``, ``cooperative_blocks_max``).

    PYTHONPATH=. python tools/probe_persistent.py --out receipts/probes/persistent.json

Needs a CUDA GPU (or Numba's simulator, with small shapes: ``tests/test_probe_persistent.py``).
Exit 0 when every GEMV phase is bitwise ``gemv``'s, 1 when one is not, 2 on bad input.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

if not hasattr(np, "row_stack"):  # numba-cuda 0.30.4 still names np.row_stack
    np.row_stack = np.vstack

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from numba import cuda  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import device_name, events_us, graph_us  # noqa: E402
from harness.atomic import write_text_atomic  # noqa: E402

F32 = np.float32
PHASE_THREADS = 256  # the small phases' stand-ins assume at most this many threads (the GEMV's block)


def add_shape_args(ap):
    """The model dimensions a draft pass's shapes come from (bench-8l's by default)."""
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=256)
    ap.add_argument("--inter", type=int, default=5632)
    ap.add_argument("--draft-vocab", type=int, default=32768)


def check_shape_args(ap, args, extra=()):
    """One line (``ap.error``) for a dimension that is not positive (those of :func:`add_shape_args`
    and ``extra``) or heads that are not a multiple of the KV heads."""
    for k in ("hidden", "heads", "kv_heads", "head_dim", "inter", "draft_vocab", *extra):
        if getattr(args, k) < 1:
            ap.error(f"--{k.replace('_', '-')} must be positive")
    if args.heads % args.kv_heads:
        ap.error("--heads must be a multiple of --kv-heads")


def shapes(a):
    """The pass's six GEMVs as (name, N, K)."""
    H, D = a.hidden, a.head_dim
    return [("fc", H, 2 * H), ("qkv", 2 * a.heads * D + 2 * a.kv_heads * D, H), ("o", H, a.heads * D),
            ("gate_up", 2 * a.inter, H), ("down", H, a.inter), ("lm_head", a.draft_vocab, H)]


def body_source(cfg, prefetch):
    """The GEMV kernel's source as ``gemv_vb(blk, first, ..., Ts, Xs, Ps)``: the block index a
    parameter, the three shared arrays the caller's. ``prefetch``: the PDL build, whose weight
    chunks in flight are loaded before its ``pdl_wait()``, with the phase's grid barrier in place
    of that wait on a block's first output block (``first``)."""
    from numba_kernels import linear

    lines, decls = [], []
    for ln in linear._gemv_kernel(cfg.with_pdl() if prefetch else cfg).splitlines():
        s = ln.strip()
        if s.startswith("def kern("):
            ln = "def gemv_vb(blk, first, X, XS, W, K, N, out, R, Z, Ts, Xs, Ps):"
        elif s.startswith(("Ts = cuda.shared", "Xs = cuda.shared", "Ps = cuda.shared")):
            decls.append(s)
            continue
        elif s == "blk = cuda.blockIdx.x":
            continue
        elif s == "pdl_wait()":
            lines += ["    if first:", "        cuda.cg.this_grid().sync()"]
            continue
        lines.append(ln)
    return linear._gemv_devices(cfg) + "@devf\n" + "\n".join(lines) + "\n", decls


SMALL = r'''
@devf
def block_sum(v, red, t, nt):
    red[t] = v
    cuda.syncthreads()
    h = nt // 2
    while h > 0:
        if t < h:
            red[t] = red[t] + red[t + h]
        cuda.syncthreads()
        h //= 2
    s = red[0]
    cuda.syncthreads()
    return s


@devf
def row_norm(src, so, dst, do, n, red, t, nt):
    """dst[do + i] = src[so + i] / rms(src[so: so + n]) by one block (a stand-in for rmsnorm)."""
    s = float32(0.0)
    i = t
    while i < n:
        v = src[so + i]
        s += v * v
        i += nt
    s = block_sum(s, red, t, nt)
    r = float32(1.0) / math.sqrt(s / float32(n) + float32(1e-6))
    i = t
    while i < n:
        dst[do + i] = src[so + i] * r
        i += nt


@devf
def add_norm(x, d, dst, n, red, t, nt):
    """x += d, then dst = x / rms(x) (a stand-in for add_rmsnorm; each thread normalises the
    elements it added)."""
    i = t
    while i < n:
        x[i] = x[i] + d[i]
        i += nt
    row_norm(x, 0, dst, 0, n, red, t, nt)


@devf
def attn_tile(q, kv, part, b, D, red, t, nt):
    """Block b: one 64-key tile of one KV head -- the dot of q with each key, then the keys'
    values weighted by it (a stand-in for the split-KV kernel's tile)."""
    base = b * 64 * D * 2
    i = t
    while i < D:
        a = float32(0.0)
        for k in range(64):
            a += kv[base + k * D + i] * q[i] + kv[base + 64 * D + k * D + i]
        part[b * D + i] = a
        i += nt


@devf
def attn_fold(part, out, h, tiles, kvh, D, t, nt):
    """Block h: query head h's output, its KV head's tiles folded in order (the merge)."""
    i = t
    while i < D:
        a = float32(0.0)
        for j in range(tiles):
            a += part[(kvh * tiles + j) * D + i]
        out[h * D + i] = a / float32(tiles) * (float32(1.0) / (float32(1.0) + math.exp(-a)))
        i += nt


@devf
def swiglu(gu, act, b, I, t, nt):
    i = b * nt + t
    if i < I:
        g = gu[i]
        act[i] = g / (float32(1.0) + math.exp(-g)) * gu[I + i]


@devf
def pick_chunk(lg, V, cand, b, ob, red, t, nt):
    """Block b: the largest of its 4·nt logits into cand[ob] (a level of the pick)."""
    m = lg[min(b * nt * 4 + t, V - 1)]
    for j in range(1, 4):
        v = lg[min(b * nt * 4 + j * nt + t, V - 1)]
        if v > m:
            m = v
    red[t] = m
    cuda.syncthreads()
    h = nt // 2
    while h > 0:
        if t < h and red[t + h] > red[t]:
            red[t] = red[t + h]
        cuda.syncthreads()
        h //= 2
    if t == 0:
        cand[ob] = red[0]
    cuda.syncthreads()
'''


def kernel_source(cfg, a, nt, prefetch):
    """The persistent pass kernel: the small phases (``small`` 1) and the six GEMV phases, a grid
    barrier after each -- with ``prefetch`` the barrier before a GEMV phase inside it, after its
    blocks' first weight loads."""
    body, decls = body_source(cfg, prefetch)
    H, D, hq, hkv, I, V = a.hidden, a.head_dim, a.heads, a.kv_heads, a.inter, a.draft_vocab
    tiles = -(-a.ctx // 64)
    L = ["def kern(W0, W1, W2, W3, W4, W5, e, hin, cat, x, h, qkv, kv, part, att, o, gu, act, dn, hf, lg, cand,"
         " x2, qkv2, o2, gu2, dn2, lg2, Z, small):"]
    a_ = L.append
    for d in decls:
        a_("    " + d)
    a_(f"    red = cuda.shared.array({nt}, np.float32)")
    a_("    g = cuda.cg.this_grid()")
    a_("    b = cuda.blockIdx.x")
    a_("    G = cuda.gridDim.x")
    a_("    t = cuda.threadIdx.x")

    def sync():
        a_("    g.sync()")

    def gemv(W, X, XS, N, K, out):
        nvb = -(-N // cfg.OB)
        a_("    vb = b")
        if prefetch:  # the barrier before the phase: in gemv_vb on a block's first output block
            a_(f"    if vb >= {nvb}:")
            a_("        g.sync()")
        a_("    first = True")
        a_(f"    while vb < {nvb}:")
        a_(f"        gemv_vb(vb, first, {X}, {XS}, {W}, {K}, {N}, {out}, 1, Z, Ts, Xs, Ps)")
        a_("        first = False")
        a_("        vb += G")
        sync()

    def small(stmts, blocks=1, before_gemv=False):
        a_("    if small == 1:")
        a_("        s = b")
        a_(f"        while s < {blocks}:")
        for st in stmts:
            a_("            " + st)
        a_("            s += G")
        if not (prefetch and before_gemv):
            sync()

    small([f"row_norm(e, 0, cat, 0, {H}, red, t, {nt})", f"row_norm(hin, 0, cat, {H}, {H}, red, t, {nt})"],
          before_gemv=True)
    gemv("W0", "cat", 2 * H, H, 2 * H, "x2")
    small([f"row_norm(x, 0, h, 0, {H}, red, t, {nt})"], before_gemv=True)
    gemv("W1", "h", H, 2 * hq * D + 2 * hkv * D, H, "qkv2")
    small([f"row_norm(qkv, 0, qkv, 0, {D}, red, t, {nt})"])  # the q/k norms and RoPE
    small([f"attn_tile(qkv, kv, part, s, {D}, red, t, {nt})"], blocks=hkv * tiles)
    small([f"attn_fold(part, att, s, {tiles}, s * {hkv} // {hq}, {D}, t, {nt})"], blocks=hq, before_gemv=True)
    gemv("W2", "att", hq * D, H, hq * D, "o2")
    small([f"add_norm(x, o, h, {H}, red, t, {nt})"], before_gemv=True)
    gemv("W3", "h", H, 2 * I, H, "gu2")
    small([f"swiglu(gu, act, s, {I}, t, {nt})"], blocks=-(-I // nt), before_gemv=True)
    gemv("W4", "act", I, H, I, "dn2")
    small([f"add_norm(x, dn, hf, {H}, red, t, {nt})"], before_gemv=True)
    gemv("W5", "hf", H, V, H, "lg2")
    C = -(-V // (4 * nt))
    small([f"pick_chunk(lg, {V}, cand, s, s, red, t, {nt})"], blocks=C)
    small([f"pick_chunk(cand, {C}, cand, 0, {C}, red, t, {nt})"])
    return body + SMALL + "\n".join(L) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="write the JSON here")
    ap.add_argument("--reps", type=int, default=20, help="timed runs of each case (median; 0: the bitwise check alone)")
    add_shape_args(ap)
    ap.add_argument("--ctx", type=int, default=512, help="the MTP head's keys (64-key tiles)")
    ap.add_argument("--max-registers", type=int, default=0,
                    help="cap the pass kernel's registers a thread (0: the compiler's choice; 128 lets two "
                         "256-thread blocks share an SM)")
    ap.add_argument("--cfg", default=None, metavar="OW,NOG,NG,PF",
                    help="a one-row GEMV configuration instead of gemv_pick's (the simulator's tests: fewer threads)")
    args = ap.parse_args(argv)
    if args.reps < 0 or args.max_registers < 0:
        ap.error("--reps and --max-registers must not be negative")
    check_shape_args(ap, args, ("ctx",))
    if not cuda.is_available():
        ap.error("needs a CUDA GPU (none is visible here)")

    from numba_kernels import cuda as kc
    from numba_kernels import launch as kl
    from numba_kernels import linear
    from numba_kernels.tags import KernelSource

    sh = shapes(args)
    if args.cfg:
        try:
            ow, nog, ng, pf = (int(v) for v in args.cfg.split(","))
            cfgs = {linear.GemvCfg(RB=1, OW=ow, NOG=nog, NG=ng, PF=pf).check()}
        except ValueError as e:
            ap.error(f"--cfg {args.cfg}: {e}")
    else:
        cfgs = {linear.gemv_pick(N, K, 1) for _, N, K in sh}
    if len(cfgs) != 1:
        ap.error(f"the pass's GEMVs need one configuration, these shapes give {len(cfgs)}: "
                 f"{sorted(c.name() for c in cfgs)}")
    cfg = cfgs.pop()
    nt = cfg.NT
    if nt > PHASE_THREADS or nt & (nt - 1):
        ap.error(f"{cfg.name()}: {nt} threads a block; the stand-ins need a power of two up to {PHASE_THREADS}")
    srcs = {pf: KernelSource(f"persistent_pass_{cfg.name()}{'_prefetch' if pf else ''}",
                             kernel_source(cfg, args, nt, pf), nt,
                             jit=(("max_registers", args.max_registers),) if args.max_registers else ())
            for pf in (False, True)}
    kerns = {pf: kl.generated(lambda _, src=src: src, ("probe_persistent", src.text)) for pf, src in srcs.items()}

    rng = np.random.default_rng(0)
    H, D, I, V = args.hidden, args.head_dim, args.inter, args.draft_vocab
    Ws = [cuda.to_device((rng.standard_normal((N, K)) / np.sqrt(K)).astype(F32)) for _, N, K in sh]
    tiles = -(-args.ctx // 64)

    def dev(n):
        return cuda.to_device(rng.standard_normal(n).astype(F32))

    bufs = dict(e=dev(H), hin=dev(H), cat=dev(2 * H), x=dev(H), h=dev(H), qkv=dev(sh[1][1]),
                kv=dev(args.kv_heads * tiles * 64 * D * 2), part=dev(args.kv_heads * tiles * D),
                att=dev(args.heads * D), o=dev(H), gu=dev(2 * I), act=dev(I), dn=dev(H), hf=dev(H), lg=dev(V),
                cand=dev(-(-V // (4 * nt)) + 1))
    Z = cuda.to_device(np.zeros(8, F32))
    flat = [w.reshape(w.shape[0] * w.shape[1]) for w in Ws]
    # each GEMV phase's input and output buffer (the outputs also as [1, N], as gemv stores them)
    ins = ["cat", "h", "att", "h", "act", "hf"]
    outs = ["x", "qkv", "o", "gu", "dn", "lg"]
    two = [bufs[n][:N].reshape(1, N) for n, (_, N, _) in zip(outs, sh)]
    # (the residual adds accumulate over runs: the stand-ins' values may grow to inf; nothing
    # branches on them, and the bitwise check runs with the small phases off)

    def run(pf, blocks, small):
        kerns[pf].disp[blocks, nt, 0, 0](*flat, *bufs.values(), *two, Z, np.int32(small))

    def timed(fn):
        return events_us(fn, args.reps)

    devc = cuda.get_current_device()
    sms = getattr(devc, "MULTIPROCESSOR_COUNT", 1)
    rows, bitwise, caps, regs = [], {}, {}, {}
    # the bitwise check: with the small phases off, every GEMV phase reads an input no phase writes
    # (cat, h, att, h, act, hf: random), so each output must be the engine's gemv of that input
    for pf in (False, True):
        run(pf, 1, 1)  # compile; the small phases' stand-ins run once
        cuda.synchronize()
        disp = kerns[pf].disp.overloads[next(iter(kerns[pf].disp.overloads), None)]
        cap = caps["prefetch" if pf else "plain"] = disp.max_cooperative_grid_blocks(nt)
        regs["prefetch" if pf else "plain"] = getattr(disp, "regs_per_thread", None)
        for o in outs:  # poison the outputs: each must be written by this run
            bufs[o].copy_to_device(np.full(bufs[o].shape, np.nan, F32))
        run(pf, min(cap, sms), 0)
        cuda.synchronize()
        for i, (name, N, K) in enumerate(sh):
            want = cuda.device_array((1, N), F32)
            kc.gemv(cuda.to_device(bufs[ins[i]].copy_to_host()[:K].reshape(1, K)), Ws[i], want, 1)
            got = bufs[outs[i]].copy_to_host()[:N]
            bitwise[f"{'prefetch' if pf else 'plain'}:{name}"] = bool(
                np.array_equal(want.copy_to_host()[0].view(np.uint32), got.view(np.uint32)))
        for per_sm in (1, 2) if args.reps else ():
            blocks = sms * per_sm
            if blocks > cap:
                continue
            rows.append({"prefetch": pf, "blocks": blocks, "blocks_per_sm": per_sm, "threads": nt,
                         "pass_us": timed(lambda: run(pf, blocks, 1)),
                         "gemv_phases_us": timed(lambda: run(pf, blocks, 0))})
    outs_dev = [cuda.device_array((1, N), F32) for _, N, _ in sh]
    xs_dev = [cuda.to_device(rng.standard_normal((1, K)).astype(F32)) for _, _, K in sh]
    nbytes = sum(4 * N * K for _, N, K in sh)
    gemv_launches = None
    if args.reps:  # the six GEMVs as the engine launches them: one CUDA graph, replayed
        for i in range(len(sh)):  # compiled before the capture
            kc.gemv(xs_dev[i], Ws[i], outs_dev[i], 1)
        gemv_launches = len(sh) * graph_us(lambda i: kc.gemv(xs_dev[i], Ws[i], outs_dev[i], 1), len(sh),
                                           replays=args.reps)
    res = {"kind": "probe-persistent", "device": device_name(), "sms": sms,
           "commit": os.environ.get("PRIMEWALK_COMMIT"), "date": time.strftime("%Y-%m-%dT%H:%M:%S"),
           "args": vars(args), "gemv_cfg": cfg.name(), "cooperative_blocks_max": caps,
           "shapes": [{"name": s[0], "N": s[1], "K": s[2]} for s in sh], "bytes": nbytes,
           "gemv_launches_us": gemv_launches, "gemv_launches_gbs": nbytes / gemv_launches / 1e3 if gemv_launches else None,
           "regs_per_thread": regs, "rows": rows,
           "bitwise": bitwise, "barriers": srcs[False].text.count("g.sync()")}
    print(f"{res['device']}: {len(sh)} GEMVs ({cfg.name()}), {nbytes / 1e6:.1f} MB"
          + (f"; six gemv launches in a graph {gemv_launches:.1f} us ({nbytes / gemv_launches / 1e3:.0f} GB/s)"
             if args.reps else "") + f"; the pass kernel {regs} registers a thread, {caps} cooperative blocks")
    for r in rows:
        print(f"{r['blocks']:4d} blocks x {nt}{', weights before the barrier' if r['prefetch'] else ''}: persistent pass "
              f"{r['pass_us']:.1f} us, its GEMV phases alone {r['gemv_phases_us']:.1f} us ({res['barriers']} grid barriers)")
    print("bitwise against gemv: " + ", ".join(f"{k} {'yes' if v else 'NO'}" for k, v in bitwise.items()))
    write_text_atomic(args.out, json.dumps(res, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0 if all(bitwise.values()) and len(bitwise) == 2 * len(sh) else 1


if __name__ == "__main__":
    sys.exit(main())
