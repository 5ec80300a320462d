"""Memory intrinsics for the fixed-order GEMM prototype (``kernels_proto/gemm.py``).

Numba-CUDA indexes arrays with 64-bit arithmetic, a negative-index wraparound test per index and
scalar loads only. These intrinsics address an array's data pointer by a flat element offset
(no wraparound, no bounds check) and emit the wide or asynchronous accesses a tiled GEMM needs:

- ``lds4(S, i)``: 4 float32 at ``S.flat[i:i+4]`` of a shared array, one ``ld.shared.v4.f32``
  (``i`` must be a multiple of 4 and the array 16-byte aligned).
- ``sts1(S, i, v)``: ``S.flat[i] = v`` for a shared array (``st.shared.f32``).
- ``ldg4p(A, off, p)``: 4 float32 at ``A.flat[off:off+4]`` (``ld.global.nc.v4.f32``), or four
  +0.0 where ``p`` is 0 (the load is not issued). ``off`` a multiple of 4, ``A`` 16-byte aligned.
- ``ldg1p(A, off, p)``: one float32 (``ld.global.nc.f32``) or +0.0.
- ``ldgh4p(A, off, p)``: 4 bf16 bit patterns (uint16) at ``A.flat[off:off+4]`` (one 8-byte
  ``ld.global.nc.v2.b32``; ``off`` a multiple of 4, ``A`` 8-byte aligned) widened exactly to
  float32: bits ``w << 16`` (the same bits as ``bits_to_f32(int32(w) << 16)``); +0.0 where ``p`` is 0.
- ``ldgh1p(A, off, p)``: one bf16 (``ld.global.nc.u16``) widened the same way, or +0.0.
- ``cpa4(S, i, si, A, off, gi, p)``: ``cp.async.ca.shared.global`` of 4 bytes from
  ``A.flat[off + gi]`` to ``S.flat[i + si]``; ``si``, ``gi`` are compile-time constants, emitted
  as address immediates (``[reg+imm]``: no address arithmetic per copy); where ``p`` is 0 it
  writes +0.0 (src-size 0: zero fill) and reads nothing.
- ``cpa16(...)``: the same for 16 bytes (``cp.async.cg``, both sides 16-byte aligned).
- ``cpa_commit()``, ``cpa_wait(n)`` (``n`` a compile-time constant): ``cp.async.commit_group`` and
  ``cp.async.wait_group n``.

Under ``NUMBA_ENABLE_CUDASIM=1`` each is a plain Python function with the same result (the copies
are synchronous there, so commit/wait do nothing). No arithmetic happens here except the exact
bf16 widening, so the fma order stays entirely in the kernel source.
"""

from __future__ import annotations

import numpy as np

from .prims import SIMULATED

F32 = np.float32

if SIMULATED:
    def _flat(A, off):
        nd = len(A.shape)
        off = int(off)
        if nd == 1:
            return A, off
        K = A.shape[nd - 1]
        return A[off // K], off % K

    def lds4(S, i):
        i = int(i)
        return S[i], S[i + 1], S[i + 2], S[i + 3]

    def sts1(S, i, v):
        S[int(i)] = v

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

    def _widen(h):
        return np.array([int(h) << 16], np.uint32).view(np.float32)[0]

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

    def cpa4(S, i, si, A, off, gi, p):
        S[int(i) + si] = ldg1p(A, int(off) + gi, p)

    def cpa16(S, i, si, A, off, gi, p):
        v = ldg4p(A, int(off) + gi, p)
        i = int(i) + si
        for e in range(4):
            S[i + e] = v[e]

    def cpa_commit():
        pass

    def cpa_wait(n):
        pass

else:
    from llvmlite import ir
    from numba.core import types
    from numba.cuda.extending import intrinsic

    _f32 = ir.FloatType()
    _i16 = ir.IntType(16)
    _i32 = ir.IntType(32)
    _i64 = ir.IntType(64)

    def _elem_ptr(context, builder, aryty, ary, idxty, idx):
        """Pointer to element ``idx`` (flat, no wraparound) of an array's data."""
        data = context.make_array(aryty)(context, builder, value=ary).data
        if idxty.bitwidth < 64:
            idx = builder.sext(idx, _i64) if idxty.signed else builder.zext(idx, _i64)
        return builder.gep(data, [idx], inbounds=True)

    def _pred(builder, pty, p):
        """An i32 0/1 from a bool or integer predicate."""
        if isinstance(pty, types.Boolean):
            return builder.zext(p, _i32)
        if pty.bitwidth != 32:
            return builder.zext(builder.icmp_unsigned("!=", p, ir.Constant(p.type, 0)), _i32)
        return p

    def _tuple4(context, builder, vals):
        return context.make_tuple(builder, types.UniTuple(types.float32, 4), vals)

    @intrinsic
    def lds4(typingctx, S, i):
        sig = types.UniTuple(types.float32, 4)(S, i)

        def codegen(context, builder, sig, args):
            p = _elem_ptr(context, builder, sig.args[0], args[0], sig.args[1], args[1])
            vt = ir.VectorType(_f32, 4)
            p3 = builder.addrspacecast(p, ir.PointerType(_f32, 3))
            v = builder.load(builder.bitcast(p3, ir.PointerType(vt, 3)), align=16)
            return _tuple4(context, builder, [builder.extract_element(v, ir.Constant(_i32, e)) for e in range(4)])

        return sig, codegen

    @intrinsic
    def sts1(typingctx, S, i, v):
        sig = types.void(S, i, v)

        def codegen(context, builder, sig, args):
            p = _elem_ptr(context, builder, sig.args[0], args[0], sig.args[1], args[1])
            val = context.cast(builder, args[2], sig.args[2], types.float32)
            builder.store(val, builder.addrspacecast(p, ir.PointerType(_f32, 3)), align=4)
            return context.get_dummy_value()

        return sig, codegen

    _LDG4 = ("{\n\t.reg .pred q;\n\tsetp.ne.b32 q, $5, 0;\n\tmov.b32 $0, 0;\n\tmov.b32 $1, 0;\n"
             "\tmov.b32 $2, 0;\n\tmov.b32 $3, 0;\n\t@q ld.global.nc.v4.f32 {$0, $1, $2, $3}, [$4];\n}")
    _LDG1 = "{\n\t.reg .pred q;\n\tsetp.ne.b32 q, $2, 0;\n\tmov.b32 $0, 0;\n\t@q ld.global.nc.f32 $0, [$1];\n}"
    _LDGH4 = ("{\n\t.reg .pred q;\n\tsetp.ne.b32 q, $3, 0;\n\tmov.b32 $0, 0;\n\tmov.b32 $1, 0;\n"
              "\t@q ld.global.nc.v2.b32 {$0, $1}, [$2];\n}")
    _LDGH1 = "{\n\t.reg .pred q;\n\tsetp.ne.b32 q, $2, 0;\n\tmov.b16 $0, 0;\n\t@q ld.global.nc.b16 $0, [$1];\n}"

    def _gptr(builder, p):
        return builder.addrspacecast(p, ir.PointerType(p.type.pointee, 1))

    @intrinsic
    def ldg4p(typingctx, A, off, p):
        sig = types.UniTuple(types.float32, 4)(A, off, p)

        def codegen(context, builder, sig, args):
            ptr = _gptr(builder, _elem_ptr(context, builder, sig.args[0], args[0], sig.args[1], args[1]))
            st = ir.LiteralStructType([_f32] * 4)
            fn = ir.FunctionType(st, [ptr.type, _i32])
            asm = ir.InlineAsm(fn, _LDG4, "=f,=f,=f,=f,l,r")
            r = builder.call(asm, [ptr, _pred(builder, sig.args[2], args[2])])
            return _tuple4(context, builder, [builder.extract_value(r, e) for e in range(4)])

        return sig, codegen

    @intrinsic
    def ldg1p(typingctx, A, off, p):
        sig = types.float32(A, off, p)

        def codegen(context, builder, sig, args):
            ptr = _gptr(builder, _elem_ptr(context, builder, sig.args[0], args[0], sig.args[1], args[1]))
            fn = ir.FunctionType(_f32, [ptr.type, _i32])
            asm = ir.InlineAsm(fn, _LDG1, "=f,l,r")
            return builder.call(asm, [ptr, _pred(builder, sig.args[2], args[2])])

        return sig, codegen

    def _widen_lo(builder, u):  # bf16 in the low half of u -> float32 bits (u << 16)
        return builder.bitcast(builder.shl(u, ir.Constant(_i32, 16)), _f32)

    def _widen_hi(builder, u):  # bf16 in the high half of u -> float32 bits (u & 0xffff0000)
        return builder.bitcast(builder.and_(u, ir.Constant(_i32, 0xFFFF0000)), _f32)

    @intrinsic
    def ldgh4p(typingctx, A, off, p):
        sig = types.UniTuple(types.float32, 4)(A, off, p)

        def codegen(context, builder, sig, args):
            ptr = _gptr(builder, _elem_ptr(context, builder, sig.args[0], args[0], sig.args[1], args[1]))
            st = ir.LiteralStructType([_i32] * 2)
            fn = ir.FunctionType(st, [ptr.type, _i32])
            asm = ir.InlineAsm(fn, _LDGH4, "=r,=r,l,r")
            r = builder.call(asm, [ptr, _pred(builder, sig.args[2], args[2])])
            u0 = builder.extract_value(r, 0)  # little-endian: element 0 in the low half
            u1 = builder.extract_value(r, 1)
            vals = [_widen_lo(builder, u0), _widen_hi(builder, u0), _widen_lo(builder, u1), _widen_hi(builder, u1)]
            return _tuple4(context, builder, vals)

        return sig, codegen

    @intrinsic
    def ldgh1p(typingctx, A, off, p):
        sig = types.float32(A, off, p)

        def codegen(context, builder, sig, args):
            ptr = _gptr(builder, _elem_ptr(context, builder, sig.args[0], args[0], sig.args[1], args[1]))
            fn = ir.FunctionType(_i16, [ptr.type, _i32])
            asm = ir.InlineAsm(fn, _LDGH1, "=h,l,r")
            h = builder.call(asm, [ptr, _pred(builder, sig.args[2], args[2])])
            return _widen_lo(builder, builder.zext(h, _i32))

        return sig, codegen

    def _cpa(nbytes, cache):
        @intrinsic
        def cpa(typingctx, S, i, si, A, off, gi, p):
            if not (isinstance(si, types.IntegerLiteral) and isinstance(gi, types.IntegerLiteral)):
                return None
            sig = types.void(S, i, si, A, off, gi, p)
            s_imm = si.literal_value * S.dtype.bitwidth // 8  # element offsets -> byte immediates
            g_imm = gi.literal_value * A.dtype.bitwidth // 8
            text = f"cp.async.{cache}.shared.global [$0+{s_imm}], [$1+{g_imm}], {nbytes}, $2;"

            def codegen(context, builder, sig, args):
                sp = _elem_ptr(context, builder, sig.args[0], args[0], sig.args[1], args[1])
                s32 = builder.ptrtoint(builder.addrspacecast(sp, ir.PointerType(sp.type.pointee, 3)), _i32)
                gp = _gptr(builder, _elem_ptr(context, builder, sig.args[3], args[3], sig.args[4], args[4]))
                size = builder.mul(_pred(builder, sig.args[6], args[6]), ir.Constant(_i32, nbytes))
                fn = ir.FunctionType(ir.VoidType(), [_i32, gp.type, _i32])
                builder.call(ir.InlineAsm(fn, text, "r,l,r,~{memory}", side_effect=True), [s32, gp, size])
                return context.get_dummy_value()

            return sig, codegen

        return cpa

    cpa4 = _cpa(4, "ca")
    cpa16 = _cpa(16, "cg")

    @intrinsic
    def cpa_commit(typingctx):
        sig = types.void()

        def codegen(context, builder, sig, args):
            fn = ir.FunctionType(ir.VoidType(), [])
            builder.call(ir.InlineAsm(fn, "cp.async.commit_group;", "~{memory}", side_effect=True), [])
            return context.get_dummy_value()

        return sig, codegen

    @intrinsic
    def cpa_wait(typingctx, n):
        if not isinstance(n, types.IntegerLiteral):
            return None
        sig = types.void(n)
        count = n.literal_value

        def codegen(context, builder, sig, args):
            fn = ir.FunctionType(ir.VoidType(), [])
            builder.call(ir.InlineAsm(fn, f"cp.async.wait_group {count};", "~{memory}", side_effect=True), [])
            return context.get_dummy_value()

        return sig, codegen
