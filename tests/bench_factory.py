"""A synthetic bench result in the committed format (``harness bench``, schema 2), for the
table, goals, figure and notebook tests. Numbers are made up and say so (device "synthetic")."""

from __future__ import annotations

import copy

from harness.gpu import bench_report as rep

_BASE = {
    "kind": "bench", "schema_version": 2, "model": "bench-8l", "device": "synthetic (no GPU)", "driver": "-",
    "commit": "0" * 40, "created": "2026-12-01T00:00:00Z", "date": "2026-12-01T00:00:00Z", "quick": False,
    "lengths": list(rep.CURVE_LENGTHS), "skip": [], "budget_s": 480.0, "wall_s": 400.0,
    "code_fingerprint": "f" * 64, "fingerprint_files": [],
    "weights_bytes_decode": 3_400_000_000, "weights_bytes_all": 4_900_000_000,
    "copy_bandwidth_bytes_per_s": 4.2e12, "decode_floor_ms": 0.81, "decode_floor_bf16_ms": 0.405,
    "sgemm": {"gemm 4096x2048x5632": {"s": 0.002, "tflops": 48.0}},
    "hf": {"fp32": {"prime_4096_s": 0.2, "prime_4096_tokens_per_s": 20480.0, "decode_ms_per_token": 11.0},
           "bf16": {"prime_4096_s": 0.08, "prime_4096_tokens_per_s": 51200.0, "decode_ms_per_token": 13.0}},
    "prime_curve": [
        {"tokens": 4096, "primewalk_s": 0.3, "hf_fp32_s": 0.2, "hf_bf16_s": 0.08, "peak_bytes": 6_000_000_000},
        {"tokens": 16384, "primewalk_s": 1.1, "hf_fp32_s": 1.2, "hf_bf16_s": 0.5, "peak_bytes": 6_500_000_000},
        {"tokens": 32768, "primewalk_s": 2.4, "hf_fp32_s": 3.9, "hf_bf16_s": 1.4, "peak_bytes": 7_000_000_000},
        {"tokens": 131072, "primewalk_s": 24.0, "hf_fp32_s": "oom", "hf_bf16_s": "skipped",
         "peak_bytes": 9_000_000_000},
    ],
    "primewalk": {
        "weights_on_device_bytes": 4_900_000_000, "chunk_rows": 4096, "captured_steps": True,
        "prime_4096_s": 0.3, "prime_4096_tokens_per_s": 4096 / 0.3,
        "decode_512_ms_per_token": 1.1, "decode_512_uncaptured_ms_per_token": 3.0,
        "decode_32k_ms_per_token": 1.9, "context_32k": 32768,
        "gemm": {"shapes": {"qkvz 4096x2048x12288": {"s": 0.008, "tflops": 26.0}}, "tflops": 26.0},
        "attention_tflops_32768": 16.0, "attention_tflops_4096": 12.0,
        "spec": {f"k{k}": {"spec_tokens_per_s": 300.0, "plain_tokens_per_s": 600.0, "same_tokens": True,
                           "mean_acceptance_length": 1.0, "draft_step_ms": 0.4 * k / 3, "verify_step_ms": 1.2}
                 for k in (1, 2, 3, 4)},
        "profile": {"prime_4096": {"total_s": 0.35, "ops": {"attention": {"s": 0.1, "calls": 2},
                                                             "linear": {"s": 0.2, "calls": 57}}}},
        "bf16": {"n/a": "no harness/engine/bf16.py in this tree"},
        "peak_used_bytes": 9_000_000_000,
    },
    "stdlib_small": {"prompt_tokens": 512, "new_tokens": 128, "decode_ms_per_token": 0.5,
                     "spec": {f"k{k}": {"spec_tokens_per_s": 900.0 + k, "plain_tokens_per_s": 700.0,
                                        "same_tokens": True, "mean_acceptance_length": 1.0 + 0.5 * k,
                                        "draft_step_ms": 0.1 * k, "verify_step_ms": 0.6} for k in (1, 2, 3, 4)}},
    "ratios": {"decode_512_over_floor": 1.1 / 0.81},
    "errors": {"hf_fp32 prime 131072": "oom: OutOfMemoryError: fake"},
}


def make_bench_result(**over) -> dict:
    r = copy.deepcopy(_BASE)
    r.update(over)
    r["goals"] = rep.goals_block(r)
    return r
