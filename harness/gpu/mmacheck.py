"""``harness mma-check [FILE.npz ...]``: the CPU emulation of the bf16 tensor-core MMA against
recorded hardware vectors, bit for bit (issue #19). Without a file it checks the committed
recording, ``receipts/mma/*.npz`` (1,174,272 H200 outputs; all match the documented rule).

A vector file (written by ``tools/mma_vectors.py`` on the GPU) holds n m16n8k16 tiles:

- ``A`` uint16 [n,16,16]: bf16 bit patterns, (m, k);
- ``B`` uint16 [n,16,8]: bf16 bit patterns, (k, n);
- ``C`` float32 [n,16,8]: the accumulator;
- ``D`` float32 [n,16,8]: what the hardware wrote for D = A·B + C;
- optionally ``category`` int [n] and ``categories`` (names), used only to report mismatches.

The check runs :func:`numba_kernels.mma.mma_check` (the documented rule, ``mma.DEFAULT``, unless
``--rule`` names a candidate) and compares the 32-bit patterns, NaN payloads included. It prints
``mma-check: M/N outputs bitwise`` and exits 0 only when M = N; 1 on a mismatch (the first one is
printed); 2 with one line on stderr when a file is unreadable or malformed.
"""

from __future__ import annotations

import argparse
import glob
import os
import sys
import zipfile

import numpy as np

from ..errors import InputError, PrimewalkError

from ..matrix.builtin import REPO as ROOT  # the checkout primewalk is installed from
COMMITTED = os.path.join("receipts", "mma")


def committed_files() -> list:
    """The committed hardware vector files (``receipts/mma/*.npz`` of this checkout), sorted."""
    return sorted(glob.glob(os.path.join(ROOT, COMMITTED, "*.npz")))


SPEC = {  # key: (dtype, shape of one tile)
    "A": (np.uint16, (16, 16)),
    "B": (np.uint16, (16, 8)),
    "C": (np.float32, (16, 8)),
    "D": (np.float32, (16, 8)),
}


def load_vectors(path: str) -> dict:
    """The arrays of a vector file, checked; InputError (one line) when it is not usable."""
    try:
        z = np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
        raise InputError(f"{path}: not a readable .npz file ({type(e).__name__})") from None
    if not hasattr(z, "files"):  # np.load gave a plain array (.npy)
        raise InputError(f"{path}: a single array, not an .npz archive with keys A, B, C, D")
    with z:
        missing = [k for k in SPEC if k not in z.files]
        if missing:
            raise InputError(f"{path}: missing key(s) {', '.join(missing)} (need A, B, C, D)")
        out = {}
        try:
            for k in list(SPEC) + [k for k in ("category", "categories") if k in z.files]:
                out[k] = z[k]
        except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
            raise InputError(f"{path}: array {k!r} cannot be read ({type(e).__name__}: "
                             f"{str(e).splitlines()[0] if str(e) else ''})") from None
    n = out["A"].shape[0] if out["A"].ndim == 3 else None
    for k, (dt, tile) in SPEC.items():
        a = out[k]
        if a.dtype != dt:
            raise InputError(f"{path}: {k} has dtype {a.dtype}, expected {np.dtype(dt).name}")
        if a.ndim != 3 or a.shape[1:] != tile:
            raise InputError(f"{path}: {k} has shape {list(a.shape)}, expected [n, {tile[0]}, {tile[1]}]")
        if a.shape[0] != n:
            raise InputError(f"{path}: {k} has {a.shape[0]} tiles, A has {n}")
    if n == 0:
        raise InputError(f"{path}: no tiles (n = 0)")
    cat = out.get("category")
    if cat is not None and (cat.ndim != 1 or cat.shape[0] != n or cat.dtype.kind not in "iu"):
        raise InputError(f"{path}: category must be an integer array of length n = {n}")
    return out


def mma_check_file(path: str, rule=None):
    """(matched, total, first_mismatch_info) for one vector file; first_mismatch_info is None
    when everything matches, otherwise a dict (tile, i, j, hardware, emulated, a_row, b_col, c,
    category). Raises InputError when the file is unusable."""
    from numba_kernels import mma

    v = load_vectors(path)
    rule = rule or mma.DEFAULT
    D = np.ascontiguousarray(v["D"]).view(np.uint32)
    E = mma.mma_check_bits(v["A"], v["B"], v["C"], rule)
    eq = E == D
    matched, total = int(eq.sum()), int(eq.size)
    if matched == total:
        return matched, total, None
    t, i, j = (int(x) for x in np.argwhere(~eq)[0])
    info = {
        "tile": t, "i": i, "j": j,
        "hardware": f"{int(D[t, i, j]):08x}", "emulated": f"{int(E[t, i, j]):08x}",
        "a_row": " ".join(f"{int(x):04x}" for x in v["A"][t, i, :]),
        "b_col": " ".join(f"{int(x):04x}" for x in v["B"][t, :, j]),
        "c": f"{int(np.ascontiguousarray(v['C']).view(np.uint32)[t, i, j]):08x}",
        "category": None,
    }
    cat = v.get("category")
    names = v.get("categories")
    if cat is not None:
        ci = int(cat[t])
        info["category"] = str(names[ci]) if names is not None and 0 <= ci < len(names) else ci
        bad = np.bincount(cat, weights=(~eq).reshape(len(D), -1).sum(1))
        info["mismatches_by_category"] = {
            (str(names[c]) if names is not None and c < len(names) else str(c)): int(bad[c])
            for c in np.nonzero(bad)[0]}
    return matched, total, info


def _run(files, rule_text=None) -> int:
    from numba_kernels import mma

    rule = None
    if rule_text:
        try:
            rule = mma.parse_rule(rule_text)
        except ValueError as e:
            raise InputError(f"--rule: {e}") from None
    default_files = not files
    if default_files:
        files = committed_files()
        if not files:
            raise InputError(f"no FILE.npz given and none committed under {COMMITTED}/")
    matched = total = 0
    first = None
    for f in files:
        m, n, info = mma_check_file(f, rule)
        matched += m
        total += n
        if info and first is None:
            first = (f, info)
    print(f"mma-check: {matched}/{total} outputs bitwise")
    if default_files:
        print("files: " + ", ".join(os.path.relpath(f, ROOT) for f in files))
    if first:
        f, d = first
        where = f" [{d['category']}]" if d.get("category") is not None else ""
        print(f"first mismatch: {f} tile {d['tile']} (i={d['i']}, j={d['j']}){where}: hardware "
              f"{d['hardware']}, emulation {d['emulated']}; A[i,:] {d['a_row']}; B[:,j] {d['b_col']}; "
              f"C {d['c']}")
        if d.get("mismatches_by_category"):
            print("mismatches by category: " + ", ".join(f"{k} {v}" for k, v in d["mismatches_by_category"].items()))
    return 0 if matched == total else 1


def _add_args(p) -> None:
    p.add_argument("files", nargs="*", metavar="FILE.npz",
                   help=f"recorded vectors (A, B, C, D); default: the committed {COMMITTED}/*.npz")
    p.add_argument("--rule", default=None, metavar="SPEC",
                   help="a candidate rule instead of the documented one, e.g. out_sub=rne,grid_floor=-150")


def register(subparsers) -> None:
    """Add ``mma-check`` to an argparse ``subparsers``; the handler returns the exit code and
    raises PrimewalkError (exit 2 in the CLI) for unusable files."""
    p = subparsers.add_parser(
        "mma-check", help="CPU emulation of the bf16 tensor-core MMA vs recorded hardware vectors, bitwise",
        description=__doc__.splitlines()[0],
        epilog="examples:\n  harness mma-check\n  harness mma-check receipts/mma/h200-mma-vectors.npz "
               "--rule grid_floor=none\n"
               "exit status: 0 all outputs bitwise, 1 a mismatch, 2 unusable file",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_args(p)
    p.set_defaults(func=lambda a: _run(a.files, a.rule))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="harness mma-check", description=__doc__.splitlines()[0])
    _add_args(ap)
    args = ap.parse_args(argv)
    try:
        return _run(args.files, args.rule)
    except PrimewalkError as e:
        print(f"harness mma-check: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
