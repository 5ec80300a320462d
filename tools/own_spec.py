"""Write a user's own checkpoint and a matrix spec over it, for the GPU evidence.

    python tools/own_spec.py DIR

DIR/ckpt is ``tests/own_checkpoint.py``'s model (random Qwen3-Next with MoE, tied embeddings,
conv kernel 3, its own tokenizer.json); DIR/own.toml runs it on two text prompts under the
schedules a user would check. ``tools/device_run.sh own`` and ``tools/device_evidence.sh`` record
its golden on the CPU twin and run the same spec on CUDA.
"""

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

import own_checkpoint as oc  # noqa: E402


def main(folder: str) -> None:
    os.makedirs(folder, exist_ok=True)
    oc.build(os.path.join(folder, "ckpt"))
    with open(os.path.join(folder, "own.toml"), "w") as f:
        f.write("max_new_tokens = 16\nk = [1, 2, 3]\n"
                'sampling = [{ temperature = 0.0, seed = 0 }, { temperature = 0.7, seed = 7 }]\n'
                'variants = ["unyielded", "tokenwise", { name = "split", at = [0.5] }, "yielded-with-peer",'
                ' { name = "yielded-with-peer", split = 0.5, checkpoint = 0.5 }, "short"]\n'
                '[models]\nown = "ckpt"\n[[prompts]]\nkind = "text"\nname = "long"\ntext = '
                + json.dumps(oc.LONG_TEXT)
                + '\n[[prompts]]\nkind = "text"\nname = "short"\ntext = "Hello there, prime walker."\n')


if __name__ == "__main__":
    main(sys.argv[1])
