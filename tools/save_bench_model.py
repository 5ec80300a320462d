"""Save bench-8l (harness bench's model: built with transformers by ``build_hf_model``, plus the
same random MTP head, seed + 1) as a primewalk checkpoint folder, so that ``harness bisect
--model DIR`` (or any ``--model``) runs on it:

    python tools/save_bench_model.py OUT_DIR [--seed 0]

Needs torch and transformers (the oracle extra), as harness bench does; the folder holds
config.json and sharded fp32 safetensors (about 3.3 GB). Then, on the GPU (issue #12's goal:
under a minute):

    harness bisect --model OUT_DIR --prompt-len 4096 --a batched --b split:2048 \\
        --backend-a cuda --backend-b cuda --fault 5:recurrence:3000
"""

import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from harness.engine.weights import save_checkpoint  # noqa: E402
from harness.gpu.bench import bench_checkpoint  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", help="folder to write (created)")
    ap.add_argument("--seed", type=int, default=0, help="harness bench's seed (default 0)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as hf:
        _, ck = bench_checkpoint(hf, args.seed)
    save_checkpoint(args.out, ck.config, ck.tensors, max_shard_bytes=2 << 30)
    print(f"bench-8l (seed {args.seed}, MTP head seed {args.seed + 1}) -> {args.out}")


if __name__ == "__main__":
    main()
