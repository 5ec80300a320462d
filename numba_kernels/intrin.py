"""Memory and warp primitives of the generated CUDA kernels (imported by :mod:`numba_kernels.launch`
only; bound into the namespace :func:`numba_kernels.launch.generated` compiles kernel sources in).

Numba-CUDA indexes arrays with 64-bit arithmetic and a negative-index wraparound test per index,
and issues scalar loads only. These primitives address an array's data pointer by a flat element
index (no wraparound, no bounds check: every index is valid by construction) and emit the wide,
read-only or asynchronous accesses a tiled kernel needs. None of them does arithmetic except the
exact bf16 widening, so every float32 operation and its order stays in the kernel source.

Shared memory (``S``: a ``cuda.shared.array``; ``i``: a flat element index):

- ``lds1(S, i)`` / ``sts1(S, i, v)``: one element (``v`` cast to the array's dtype);
- ``lds2(S, i)``, ``lds4(S, i)``: 2 or 4 consecutive elements in one ``ld.shared.v2/v4``
  (``i`` a multiple of 2 / 4, the array 16-byte aligned); ``sts4(S, i, a, b, c, d)`` the store.

Global memory (read-only for the kernel's lifetime: ``ld.global.nc``):

- ``ldg4(A, i)``: 16 bytes at flat element ``i`` (16-byte aligned): 4 float32 of a float32 array,
  or 4 int32 words (8 bf16 bit patterns, little-endian) of a uint16 array;
- ``ldgz4(A, i, Z, ok)``: the same, or 16 zero bytes of ``Z`` where ``ok`` is false (a select of
  the pointer: no branch, ``A`` not touched);
- ``ldg4p(A, off, p)`` / ``ldg1p(A, off, p)``: 4 float32 (one ``v4`` load, ``off`` a multiple of 4)
  or one float32 at flat element ``off``, or +0.0 where ``p`` is 0 (the load is not issued);
- ``ldgh4p(A, off, p)`` / ``ldgh1p(A, off, p)``: 4 or 1 bf16 bit patterns (uint16) widened exactly to
  float32 (bits ``w << 16``), or +0.0;
- ``ld4g(A, row, col)``: ``A[row, col : col + 4]`` in one 16-byte load; ``ld4gf(A, off, rs)`` the
  same at flat element ``off``.

Asynchronous copies global → shared (``cp.async``): ``cp16(S, i, A, row, col)`` / ``cp4`` copy
16 / 4 bytes of ``A[row, col:]`` to ``S[i:]``; ``cp16f(S, i, A, off, rs)`` / ``cp4f`` from flat
element ``off``; ``cp16b(S, sb, A, gb, rs)`` the 16 bytes at byte ``gb`` of ``A``'s data to byte
``sb`` of ``S`` (byte offsets a kernel precomputes per row: one add each for the addresses);
``cp_commit()``, ``cp_wait0()``, ``cp_wait1()``, ``cp_wait2()`` (``cp.async.commit_group``,
``wait_group 0/1/2``); ``cp_wait_group(n)`` builds the ``wait_group n`` one.

Programmatic dependent launch (sm_90, :func:`pdl_emit`): ``pdl_trigger()``
(``griddepcontrol.launch_dependents``: a kernel launched after this one with the
programmatic-serialization attribute, :func:`numba_kernels.launch.launch` ``pdl=True``, may
start before this one ends) and ``pdl_wait()`` (``griddepcontrol.wait``: the executing thread
waits until the kernels it depends on have completed and their writes are visible; a kernel not
launched that way has none pending and passes at once). Where PDL is off both compile to nothing.

Other: ``sel(c, a, b)`` (a branch-free select); ``xput``, ``xget``, ``xdone``: a warp exchange of
two values per lane (``xput(xb, w, lane, a, b)`` publishes, ``xget(xb, w, which, v, src)`` reads
lane ``src``'s ``v``: ``shfl_sync`` on the GPU; under the simulator, which has no warp shuffles,
the shared buffer ``xb`` and two block barriers).

Under ``NUMBA_ENABLE_CUDASIM=1`` each primitive is a plain Python function with the same result
(the copies are synchronous there, so commit and wait do nothing).
"""

from __future__ import annotations

import numpy as np
from numba import cuda
from numba.core import config as _nb_config

from .exact import F32

SIMULATED = bool(_nb_config.ENABLE_CUDASIM)
_FULL = 0xFFFFFFFF
PDL_ENV = "PRIMEWALK_PDL"  # "0": off; "1": on even without a GPU (compile checks); unset: on from sm_90
_PDL: dict = {}


def pdl_emit() -> bool:
    """Whether ``pdl_trigger`` / ``pdl_wait`` emit their instructions, fixed at the first call of
    the process: never under the simulator or with ``PRIMEWALK_PDL=0``; with ``PRIMEWALK_PDL=1``
    always (``tools/check_compile.py`` compiles for sm_90 without a GPU); else when the current
    device is sm_90 or newer (``griddepcontrol`` is sm_90 PTX)."""
    v = _PDL.get("emit")
    if v is None:
        import os

        env = os.environ.get(PDL_ENV, "")
        if SIMULATED or env == "0":
            v = False
        elif env == "1":
            v = True
        else:
            try:
                v = tuple(cuda.get_current_device().compute_capability) >= (9, 0)
            except Exception:  # noqa: BLE001  (no device, no driver)
                v = False
        _PDL["emit"] = v
    return v

if SIMULATED:
    def _widen(h):
        return np.array([int(h) << 16], np.uint32).view(np.float32)[0]

    def _flat(A, off):
        """(row view, column) of flat element ``off`` of a C-contiguous array."""
        off = int(off)
        if len(A.shape) == 1:
            return A, off
        K = A.shape[len(A.shape) - 1]
        return A[off // K], off % K

    def lds1(S, i):
        return S[int(i)]

    def sts1(S, i, v):
        S[int(i)] = v

    def lds2(S, i):
        i = int(i)
        return S[i], S[i + 1]

    def lds4(S, i):
        i = int(i)
        return S[i], S[i + 1], S[i + 2], S[i + 3]

    def sts4(S, i, a, b, c, d):
        i = int(i)
        S[i], S[i + 1], S[i + 2], S[i + 3] = a, b, c, d

    def ldg4(A, i):
        i = int(i)
        if A.dtype == np.uint16:  # eight bf16 as four little-endian int32 words
            u = np.array([A[i + k] for k in range(8)], np.uint16).view(np.int32)
            return u[0], u[1], u[2], u[3]
        return A[i], A[i + 1], A[i + 2], A[i + 3]

    def ldgz4(A, i, Z, ok):
        if ok:
            return ldg4(A, i)
        z = np.int32(0) if A.dtype == np.uint16 else F32(0.0)
        return z, z, z, z

    def ldg4p(A, off, p):
        if not p:
            return F32(0.0), F32(0.0), F32(0.0), F32(0.0)
        row, c = _flat(A, off)
        return F32(row[c]), F32(row[c + 1]), F32(row[c + 2]), F32(row[c + 3])

    def ldg1p(A, off, p):
        if not p:
            return F32(0.0)
        row, c = _flat(A, off)
        return F32(row[c])

    def ldgh4p(A, off, p):
        if not p:
            return F32(0.0), F32(0.0), F32(0.0), F32(0.0)
        row, c = _flat(A, off)
        return _widen(row[c]), _widen(row[c + 1]), _widen(row[c + 2]), _widen(row[c + 3])

    def ldgh1p(A, off, p):
        if not p:
            return F32(0.0)
        row, c = _flat(A, off)
        return _widen(row[c])

    def ld4g(A, r, c):
        return A[r, c], A[r, c + 1], A[r, c + 2], A[r, c + 3]

    def ld4gf(A, off, rs):
        r, c = divmod(int(off), rs)
        return A[r, c], A[r, c + 1], A[r, c + 2], A[r, c + 3]

    def cp16(S, i, A, r, c):
        for k in range(4):
            S[i + k] = A[r, c + k]

    def cp4(S, i, A, r, c):
        S[i] = A[r, c]

    def cp16f(S, i, A, off, rs):
        r, c = divmod(int(off), rs)
        for k in range(4):
            S[i + k] = A[r, c + k]

    def cp4f(S, i, A, off, rs):
        r, c = divmod(int(off), rs)
        S[i] = A[r, c]

    def cp16b(S, sb, A, gb, rs):
        i = int(sb) // 4
        r, c = divmod(int(gb) // 4, rs)
        for k in range(4):
            S[i + k] = A[r, c + k]

    def cp_commit():
        pass

    def cp_wait0():
        pass

    def cp_wait1():
        pass

    def cp_wait2():
        pass

    def cp_wait_group(n):
        def wait():
            pass
        return wait

    def pdl_trigger():  # one kernel at a time under the simulator: nothing to overlap
        pass

    def pdl_wait():
        pass

    def sel(c, a, b):
        return a if c else b

    @cuda.jit(device=True)  # a simulated device function: its ``cuda`` is the running block's
    def xput(xb, w, lane, a, b):
        xb[0, w, lane] = a
        xb[1, w, lane] = b
        cuda.syncthreads()

    def xget(xb, w, which, v, src):
        return xb[which, w, src]

    @cuda.jit(device=True)
    def xdone(xb):
        cuda.syncthreads()

else:
    from llvmlite import ir
    from numba.core import types
    from numba.cuda.extending import intrinsic

    _f32 = ir.FloatType()
    _i16 = ir.IntType(16)
    _i32 = ir.IntType(32)
    _i64 = ir.IntType(64)

    def _elem_ptr(context, builder, aryty, ary, idxty, idx):
        """Pointer to flat element ``idx`` of an array's data (no wraparound)."""
        data = context.make_array(aryty)(context, builder, value=ary).data
        if idxty.bitwidth < 64:
            idx = builder.sext(idx, _i64) if idxty.signed else builder.zext(idx, _i64)
        return builder.gep(data, [idx], inbounds=True)

    def _space(builder, p, space, elt=None):
        """``p`` in address space ``space`` (3: shared, 1: global), as a pointer to ``elt``."""
        elt = elt or p.type.pointee
        return builder.bitcast(builder.addrspacecast(p, ir.PointerType(p.type.pointee, space)),
                               ir.PointerType(elt, space))

    def _nb_ir(context, nbty):
        return context.get_value_type(nbty)

    def _tuple(context, builder, nbty, vals):
        return context.make_tuple(builder, types.UniTuple(nbty, len(vals)), vals)

    # ---- shared memory ---------------------------------------------------------------------
    @intrinsic
    def lds1(typingctx, S, i):
        sig = S.dtype(S, i)

        def codegen(context, builder, sig, args):
            p = _elem_ptr(context, builder, sig.args[0], args[0], sig.args[1], args[1])
            return builder.load(_space(builder, p, 3))

        return sig, codegen

    @intrinsic
    def sts1(typingctx, S, i, v):
        sig = types.void(S, i, v)

        def codegen(context, builder, sig, args):
            p = _elem_ptr(context, builder, sig.args[0], args[0], sig.args[1], args[1])
            val = context.cast(builder, args[2], sig.args[2], sig.args[0].dtype)
            builder.store(val, _space(builder, p, 3))
            return context.get_dummy_value()

        return sig, codegen

    def _lds_n(n):
        def lds(typingctx, S, i):
            sig = types.UniTuple(S.dtype, n)(S, i)

            def codegen(context, builder, sig, args):
                p = _elem_ptr(context, builder, sig.args[0], args[0], sig.args[1], args[1])
                elt = _nb_ir(context, sig.args[0].dtype)
                v = builder.load(_space(builder, p, 3, ir.VectorType(elt, n)), align=4 * n)
                return _tuple(context, builder, sig.args[0].dtype,
                              [builder.extract_element(v, ir.Constant(_i32, k)) for k in range(n)])

            return sig, codegen
        return intrinsic(lds)

    lds2 = _lds_n(2)
    lds4 = _lds_n(4)

    @intrinsic
    def sts4(typingctx, S, i, a, b, c, d):
        sig = types.void(S, i, a, b, c, d)

        def codegen(context, builder, sig, args):
            p = _elem_ptr(context, builder, sig.args[0], args[0], sig.args[1], args[1])
            dt = sig.args[0].dtype
            elt = _nb_ir(context, dt)
            v = ir.Constant(ir.VectorType(elt, 4), ir.Undefined)
            for k in range(4):
                x = context.cast(builder, args[2 + k], sig.args[2 + k], dt)
                v = builder.insert_element(v, x, ir.Constant(_i32, k))
            builder.store(v, _space(builder, p, 3, ir.VectorType(elt, 4)), align=16)
            return context.get_dummy_value()

        return sig, codegen

    # ---- global memory: 16-byte read-only loads --------------------------------------------
    def _word(A):
        """(llvm, numba) type of one of the four words a 16-byte load returns from array A."""
        return (_i32, types.int32) if A.dtype == types.uint16 else (_f32, types.float32)

    def _invariant(builder, v):
        v.set_metadata("invariant.load", builder.module.add_metadata([]))
        return v

    @intrinsic
    def ldg4(typingctx, A, i):
        wt = _word(A)[1]
        sig = types.UniTuple(wt, 4)(A, i)

        def codegen(context, builder, sig, args):
            p = _elem_ptr(context, builder, sig.args[0], args[0], sig.args[1], args[1])
            elt = _word(sig.args[0])[0]
            v = _invariant(builder, builder.load(_space(builder, p, 1, ir.VectorType(elt, 4)), align=16))
            return _tuple(context, builder, wt, [builder.extract_element(v, ir.Constant(_i32, k)) for k in range(4)])

        return sig, codegen

    @intrinsic
    def ldgz4(typingctx, A, i, Z, ok):
        wt = _word(A)[1]
        sig = types.UniTuple(wt, 4)(A, i, Z, ok)

        def codegen(context, builder, sig, args):
            p = _elem_ptr(context, builder, sig.args[0], args[0], sig.args[1], args[1])
            z = context.make_array(sig.args[2])(context, builder, value=args[2])
            zp = builder.bitcast(z.data, p.type)
            q = builder.select(context.cast(builder, args[3], sig.args[3], types.boolean), p, zp)
            elt = _word(sig.args[0])[0]
            v = _invariant(builder, builder.load(_space(builder, q, 1, ir.VectorType(elt, 4)), align=16))
            return _tuple(context, builder, wt, [builder.extract_element(v, ir.Constant(_i32, k)) for k in range(4)])

        return sig, codegen

    # ---- global memory: predicated loads (zero when the predicate is false) ----------------
    _LDG4 = ("{\n\t.reg .pred q;\n\tsetp.ne.b32 q, $5, 0;\n\tmov.b32 $0, 0;\n\tmov.b32 $1, 0;\n"
             "\tmov.b32 $2, 0;\n\tmov.b32 $3, 0;\n\t@q ld.global.nc.v4.f32 {$0, $1, $2, $3}, [$4];\n}")
    _LDG1 = "{\n\t.reg .pred q;\n\tsetp.ne.b32 q, $2, 0;\n\tmov.b32 $0, 0;\n\t@q ld.global.nc.f32 $0, [$1];\n}"
    _LDGH4 = ("{\n\t.reg .pred q;\n\tsetp.ne.b32 q, $3, 0;\n\tmov.b32 $0, 0;\n\tmov.b32 $1, 0;\n"
              "\t@q ld.global.nc.v2.b32 {$0, $1}, [$2];\n}")
    _LDGH1 = "{\n\t.reg .pred q;\n\tsetp.ne.b32 q, $2, 0;\n\tmov.b16 $0, 0;\n\t@q ld.global.nc.b16 $0, [$1];\n}"

    def _gptr(context, builder, sig, args):
        p = _elem_ptr(context, builder, sig.args[0], args[0], sig.args[1], args[1])
        return builder.addrspacecast(p, ir.PointerType(p.type.pointee, 1))

    def _pred(builder, pty, p):
        """An i32 0/1 from a bool or integer predicate."""
        if isinstance(pty, types.Boolean):
            return builder.zext(p, _i32)
        if pty.bitwidth != 32:
            return builder.zext(builder.icmp_unsigned("!=", p, ir.Constant(p.type, 0)), _i32)
        return p

    def _widen_lo(builder, u):  # bf16 in the low half of u -> float32 bits (u << 16)
        return builder.bitcast(builder.shl(u, ir.Constant(_i32, 16)), _f32)

    def _widen_hi(builder, u):  # bf16 in the high half of u -> float32 bits (u & 0xffff0000)
        return builder.bitcast(builder.and_(u, ir.Constant(_i32, 0xFFFF0000)), _f32)

    def _ldg4_codegen(ty, asm_text, reg):
        """The codegen of a predicated 16-byte load returning 4 ``ty`` (``reg``: their LLVM type
        and asm constraint, ``(_f32, "f")`` or ``(_i32, "r")``)."""
        lt, c = reg

        def codegen(context, builder, sig, args):
            ptr = _gptr(context, builder, sig, args)
            asm = ir.InlineAsm(ir.FunctionType(ir.LiteralStructType([lt] * 4), [ptr.type, _i32]), asm_text,
                               ",".join([f"={c}"] * 4) + ",l,r")
            r = builder.call(asm, [ptr, _pred(builder, sig.args[2], args[2])])
            return _tuple(context, builder, ty, [builder.extract_value(r, e) for e in range(4)])

        return codegen

    @intrinsic
    def ldg4p(typingctx, A, off, p):
        return types.UniTuple(types.float32, 4)(A, off, p), _ldg4_codegen(types.float32, _LDG4, (_f32, "f"))

    _LDG4U = _LDG4.replace("v4.f32", "v4.b32")

    @intrinsic
    def ldg4u(typingctx, A, off, p):
        """ldg4p's load as 4 uint32 words (the bits, for a uint32 array: the tensor-core kernels)."""
        return types.UniTuple(types.uint32, 4)(A, off, p), _ldg4_codegen(types.uint32, _LDG4U, (_i32, "r"))

    @intrinsic
    def ldg1p(typingctx, A, off, p):
        sig = types.float32(A, off, p)

        def codegen(context, builder, sig, args):
            ptr = _gptr(context, builder, sig, args)
            asm = ir.InlineAsm(ir.FunctionType(_f32, [ptr.type, _i32]), _LDG1, "=f,l,r")
            return builder.call(asm, [ptr, _pred(builder, sig.args[2], args[2])])

        return sig, codegen

    @intrinsic
    def ldgh4p(typingctx, A, off, p):
        sig = types.UniTuple(types.float32, 4)(A, off, p)

        def codegen(context, builder, sig, args):
            ptr = _gptr(context, builder, sig, args)
            asm = ir.InlineAsm(ir.FunctionType(ir.LiteralStructType([_i32] * 2), [ptr.type, _i32]), _LDGH4,
                               "=r,=r,l,r")
            r = builder.call(asm, [ptr, _pred(builder, sig.args[2], args[2])])
            u0 = builder.extract_value(r, 0)  # little-endian: element 0 in the low half
            u1 = builder.extract_value(r, 1)
            vals = [_widen_lo(builder, u0), _widen_hi(builder, u0), _widen_lo(builder, u1), _widen_hi(builder, u1)]
            return _tuple(context, builder, types.float32, vals)

        return sig, codegen

    @intrinsic
    def ldgh1p(typingctx, A, off, p):
        sig = types.float32(A, off, p)

        def codegen(context, builder, sig, args):
            ptr = _gptr(context, builder, sig, args)
            asm = ir.InlineAsm(ir.FunctionType(_i16, [ptr.type, _i32]), _LDGH1, "=h,l,r")
            h = builder.call(asm, [ptr, _pred(builder, sig.args[2], args[2])])
            return _widen_lo(builder, builder.zext(h, _i32))

        return sig, codegen

    # ---- global memory: 16-byte loads of a row (attention) ---------------------------------
    def _row_ptr(context, builder, arrty, arr, inds):
        from numba.cuda import cgutils

        a = context.make_array(arrty)(context, builder, value=arr)
        idx = [builder.sext(i, _i64) if i.type.width < 64 else i for i in inds]
        return cgutils.get_item_pointer(context, builder, arrty, a, idx)

    def _vec4(context, builder, sig, p):
        v = builder.load(builder.bitcast(p, ir.VectorType(_f32, 4).as_pointer()), align=16)
        return _tuple(context, builder, types.float32, [builder.extract_element(v, ir.Constant(_i32, k))
                                                        for k in range(4)])

    @intrinsic
    def ld4g(typingctx, A, row, col):
        sig = types.UniTuple(types.float32, 4)(A, row, col)

        def codegen(context, builder, sig, args):
            return _vec4(context, builder, sig, _row_ptr(context, builder, sig.args[0], args[0], [args[1], args[2]]))

        return sig, codegen

    def _flat_ptr(context, builder, sig, args, which=0):
        a = context.make_array(sig.args[which])(context, builder, value=args[which])
        so = args[which + 1]
        so = so if so.type.width == 64 else builder.sext(so, _i64)
        return builder.gep(a.data, [so])

    @intrinsic
    def ld4gf(typingctx, A, off, rs):
        sig = types.UniTuple(types.float32, 4)(A, off, rs)

        def codegen(context, builder, sig, args):
            return _vec4(context, builder, sig, _flat_ptr(context, builder, sig, args))

        return sig, codegen

    # ---- cp.async ---------------------------------------------------------------------------
    def _cp_asm(builder, dst, src, nbytes):
        kind = "cg" if nbytes == 16 else "ca"
        d32 = builder.ptrtoint(builder.addrspacecast(dst, ir.PointerType(_f32, 3)), _i32)
        s64 = builder.ptrtoint(builder.addrspacecast(src, ir.PointerType(_f32, 1)), _i64)
        fn = ir.FunctionType(ir.VoidType(), [_i32, _i64])
        asm = ir.InlineAsm(fn, f"cp.async.{kind}.shared.global [$0], [$1], {nbytes};", "r,l,~{memory}",
                           side_effect=True)
        builder.call(asm, [d32, s64])

    def _cp_rc(nbytes):
        def cp(typingctx, S, i, A, row, col):
            sig = types.void(S, i, A, row, col)

            def codegen(context, builder, sig, args):
                d = _row_ptr(context, builder, sig.args[0], args[0], [args[1]])
                s = _row_ptr(context, builder, sig.args[2], args[2], [args[3], args[4]])
                _cp_asm(builder, d, s, nbytes)
                return context.get_dummy_value()

            return sig, codegen
        return intrinsic(cp)

    def _cp_flat(nbytes):
        def cp(typingctx, S, i, A, off, rs):
            sig = types.void(S, i, A, off, rs)

            def codegen(context, builder, sig, args):
                d = _row_ptr(context, builder, sig.args[0], args[0], [args[1]])
                s = _flat_ptr(context, builder, sig, args, which=2)
                _cp_asm(builder, d, s, nbytes)
                return context.get_dummy_value()

            return sig, codegen
        return intrinsic(cp)

    cp16, cp4 = _cp_rc(16), _cp_rc(4)
    cp16f, cp4f = _cp_flat(16), _cp_flat(4)

    @intrinsic
    def cp16b(typingctx, S, sb, A, gb, rs):
        """cp.async of 16 bytes: byte gb of A's data → byte sb of the shared array S (integers of
        any width: sb truncated to 32 bits, the shared window's; gb to 64)."""
        sig = types.void(S, sb, A, gb, rs)

        def codegen(context, builder, sig, args):
            s = context.make_array(sig.args[0])(context, builder, value=args[0])
            a = context.make_array(sig.args[2])(context, builder, value=args[2])
            sbase = builder.ptrtoint(builder.addrspacecast(s.data, ir.PointerType(s.data.type.pointee, 3)), _i32)
            gbase = builder.ptrtoint(builder.addrspacecast(a.data, ir.PointerType(a.data.type.pointee, 1)), _i64)
            sb_, gb_ = args[1], args[3]
            sb_ = builder.trunc(sb_, _i32) if sb_.type.width > 32 else builder.zext(sb_, _i32) if sb_.type.width < 32 else sb_
            gb_ = builder.sext(gb_, _i64) if gb_.type.width < 64 else gb_
            fn = ir.FunctionType(ir.VoidType(), [_i32, _i64])
            asm = ir.InlineAsm(fn, "cp.async.cg.shared.global [$0], [$1], 16;", "r,l,~{memory}", side_effect=True)
            builder.call(asm, [builder.add(sbase, sb_), builder.add(gbase, gb_)])
            return context.get_dummy_value()

        return sig, codegen

    def _asm0(text, when=None):
        """An intrinsic of no operands emitting ``text`` (a memory clobber); with ``when``, only
        where ``when()`` holds as a kernel using it is compiled (else nothing)."""
        def f(typingctx):
            sig = types.void()

            def codegen(context, builder, sig, args):
                if when is None or when():
                    asm = ir.InlineAsm(ir.FunctionType(ir.VoidType(), []), text, "~{memory}", side_effect=True)
                    builder.call(asm, [])
                return context.get_dummy_value()

            return sig, codegen
        return intrinsic(f)

    cp_commit = _asm0("cp.async.commit_group;")
    cp_wait0 = _asm0("cp.async.wait_group 0;")
    cp_wait1 = _asm0("cp.async.wait_group 1;")
    cp_wait2 = _asm0("cp.async.wait_group 2;")

    def cp_wait_group(n):
        """An intrinsic ``cp.async.wait_group n`` (n a Python int fixed when a kernel is built)."""
        return _asm0(f"cp.async.wait_group {int(n)};")

    pdl_trigger = _asm0("griddepcontrol.launch_dependents;", pdl_emit)
    pdl_wait = _asm0("griddepcontrol.wait;", pdl_emit)

    # ---- select, warp exchange ---------------------------------------------------------------
    @intrinsic
    def sel(typingctx, c, a, b):
        sig = a(c, a, b)

        def codegen(context, builder, sig, args):
            cond = context.cast(builder, args[0], sig.args[0], types.boolean)
            y = context.cast(builder, args[2], sig.args[2], sig.args[1])
            return builder.select(cond, args[1], y)

        return sig, codegen

    _devf = cuda.jit(device=True, forceinline=True)

    @_devf
    def xput(xb, w, lane, a, b):
        pass

    @_devf
    def xget(xb, w, which, v, src):
        return cuda.shfl_sync(_FULL, v, src)

    @_devf
    def xdone(xb):
        pass


PRIMITIVES = ("lds1", "sts1", "lds2", "lds4", "sts4", "ldg4", "ldgz4", "ldg4p", "ldg1p", "ldgh4p", "ldgh1p", "ld4g",
         "ld4gf", "cp16", "cp4", "cp16f", "cp4f", "cp16b", "cp_commit", "cp_wait0", "cp_wait1", "cp_wait2", "pdl_trigger", "pdl_wait", "sel", "xput", "xget", "xdone")


def bindings() -> dict:
    """{name: primitive} for the namespace generated kernels are compiled in."""
    g = globals()
    return {n: g[n] for n in PRIMITIVES}
