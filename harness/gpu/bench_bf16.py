"""``harness bench``'s bf16 variant of ``bench-8l``: decode with bf16-resident weights against
its own floor and against transformers bf16, in the same run.

The checkpoint is HF's own bf16 save of the bench model (``model.to(bfloat16).save_pretrained``:
round to nearest even, done by torch), plus a random MTP head truncated to bf16 values. primewalk
runs it twice on the device: ``weights="bf16"`` (matrices resident as bf16 bits, widened in
registers: :mod:`harness.engine.bf16`) and ``weights="f32"`` (the same values widened on the
host); the logits of a 64-token prime must be bitwise equal (the device receipt of the bf16
claim). The bf16 floor is the bytes a decode step reads once -- every trunk weight at its resident
size (bf16 matrices 2 bytes, norms / conv / ``A_log`` / ``dt_bias`` 4 bytes), lm head included,
embedding excluded (one row is read) -- over the device-to-device copy bandwidth.
"""

from __future__ import annotations

import numpy as np

from ..engine import bf16

NAN = float("nan")


def bf16_checkpoint(model, folder: str, seed: int):
    """Save ``model`` (an HF model) as bf16 to ``folder`` and load it, with a random MTP head of
    bf16 values; the model itself is left in bf16."""
    import torch

    from ..engine.weights import load_checkpoint
    from ..synth import random_tensors

    model.to(torch.bfloat16).save_pretrained(folder, safe_serialization=True)
    ck = load_checkpoint(folder)
    mtp = random_tensors(ck.config, seed, mtp=True, trunk=False)
    ck.tensors.update({k: bf16.widen(bf16.narrow(v)) if v.ndim >= 2 else v for k, v in mtp.items()})
    ck.config.num_nextn_predict_layers = 1
    return ck


def decode_bytes(tensors: dict, resident: str) -> int:
    """Bytes of the trunk weights one decode step reads (MTP head and embedding excluded) when the
    weights are ``resident`` ("f32" | "bf16")."""
    kept = set(bf16.matrix_names(tensors)) if resident == "bf16" else set()
    return sum(a.size * (2 if k in kept else 4) for k, a in tensors.items()
               if not k.startswith("mtp.") and k != "model.embed_tokens.weight")


def ours_bf16(ck, ids512, quick: bool, backend: str = "cuda") -> dict:
    """Decode ms/token at 512 and 32k (4096 with ``quick``) context with bf16-resident weights,
    and whether a 64-token prime's logits equal the widened float32 engine's bitwise."""
    from .bench import _fill_random_context, decode_ms
    from ..engine.model import Engine

    res = {}
    ids64 = np.asarray(ids512[:64])
    logits = {}
    for mode in ("f32", "bf16"):  # the f32 engine first, then dropped: one engine's weights at a time
        eng = Engine(ck, backend, weights=mode)
        assert eng.weights == mode
        logits[mode] = np.asarray(eng.target_step(eng.new_session(80), ids64)[0]).copy()
        if mode == "f32":
            del eng
    res["logits_bitwise_vs_widened_f32"] = bool(np.array_equal(logits["f32"].view(np.uint32),
                                                               logits["bf16"].view(np.uint32)))

    def after(n):
        s = eng.new_session(n + 64)
        if n <= len(ids512):
            eng.prime_chunk(s, np.asarray(ids512[:n]))
        else:
            _fill_random_context(eng, s, n, np.random.default_rng(0))
        return decode_ms(eng, s, 32)

    res["decode_512_ms_per_token"] = min(after(len(ids512)) for _ in range(2))
    res["context_32k"] = 32768 if not quick else 4096
    res["decode_32k_ms_per_token"] = after(res["context_32k"])
    return res


def ratios_goals(r_bf16: dict, hf_bf16: dict, floor_ms: float) -> tuple[dict, dict]:
    ratios = {"decode_512_bf16_over_bf16_floor": r_bf16["decode_512_ms_per_token"] / floor_ms,
              "decode_32k_bf16_over_bf16_floor": r_bf16["decode_32k_ms_per_token"] / floor_ms,
              "decode_bf16_speedup_vs_hf_bf16": hf_bf16.get("decode_ms_per_token", NAN)
              / r_bf16["decode_512_ms_per_token"]}
    goals = {"decode_512 bf16 <= 1.5 x bf16 floor": ratios["decode_512_bf16_over_bf16_floor"] <= 1.5,
             "bf16 logits bitwise = widened f32": r_bf16["logits_bitwise_vs_widened_f32"]}
    return ratios, goals


def table_lines(r: dict) -> list:
    """The bf16 lines of the bench table (none for a result without the variant)."""
    b = r.get("primewalk_bf16")
    if not b:
        return []
    hf = r["hf"]["bf16"].get("decode_ms_per_token", NAN)
    return [f"{'decode @512 ms/tok bf16':24s} {b['decode_512_ms_per_token']:12.3f} {NAN:12.3f} {hf:12.3f}",
            f"{'decode @' + str(b['context_32k']) + ' bf16':24s} {b['decode_32k_ms_per_token']:12.3f} {NAN:12.3f} "
            f"{NAN:12.3f}",
            f"bf16 decode floor {r['decode_floor_bf16_ms']:.3f} ms/token ({r['weights_bytes_decode_bf16'] / 2**30:.2f} "
            f"GiB read per token); bf16 logits bitwise = widened f32: {b['logits_bitwise_vs_widened_f32']}"]
