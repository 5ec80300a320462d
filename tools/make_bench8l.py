"""Write bench-8l as a checkpoint folder: the model `harness bench` builds, with its MTP head.

    python tools/make_bench8l.py [--out out/bench-8l] [--seed 0]

bench-8l is Qwen3-Next's dimensions with 8 layers and random weights (harness/gpu/bench.py's
``build_hf_model``: transformers, seeded); HF's class has no MTP head, so a random one is added
(seed + 1) exactly as ``harness bench`` does. The folder (config.json + model.safetensors,
float32, about 4.9 GB) is what ``harness/specs/fairness/bench-8l.toml`` names. Needs torch and
transformers (pip install '.[oracle]'); runs on the CPU in a minute or two.
"""

import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from harness.engine.weights import load_checkpoint, save_checkpoint  # noqa: E402
from harness.gpu.bench import build_hf_model, with_mtp_head  # noqa: E402

DEFAULT_OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "out", "bench-8l")


def make(out: str, seed: int = 0, config=None) -> str:
    """Build the model in a temporary folder, add the MTP head, save it to ``out``; returns the
    saved checkpoint's weights sha256."""
    with tempfile.TemporaryDirectory() as tmp:
        build_hf_model(tmp, seed, config)
        ck = with_mtp_head(load_checkpoint(tmp), seed + 1)
    save_checkpoint(out, ck.config, ck.tensors)
    return load_checkpoint(out).sha256


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=DEFAULT_OUT, help="checkpoint folder to write (default: out/bench-8l)")
    ap.add_argument("--seed", type=int, default=0, help="the seed harness bench uses (default 0)")
    args = ap.parse_args(argv)
    sha = make(args.out, args.seed)
    print(f"wrote {os.path.normpath(args.out)} (weights sha256 {sha[:16]}…)")


if __name__ == "__main__":
    main()
