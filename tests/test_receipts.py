"""Receipts: write/read round trip, atomic writes, the CSV beside the JSON, schema refusal with
the regenerate command, pandas loading, spec hash, env, and merging shards."""

from __future__ import annotations

import copy
import csv
import hashlib
import io
import json
import os
import random
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from receipt_factory import find_cell, make_receipt  # noqa: E402

from harness.errors import PrimewalkError  # noqa: E402
from harness.matrix import receipts  # noqa: E402
from harness.matrix.receipts import (  # noqa: E402
    COMPARED,
    INFORMATIONAL,
    SCHEMA_VERSION,
    compared_fields,
    env_info,
    field_role,
    load,
    merge_receipts,
    read_receipt,
    spec_hash,
    write_receipt,
)


@pytest.fixture
def receipt():
    return make_receipt()


def one_line(e) -> str:
    text = str(e.value)
    assert "\n" not in text, text
    return text


# --- write / read ---------------------------------------------------------------------------


def test_roundtrip(tmp_path, receipt):
    path = tmp_path / "run.json"
    write_receipt(str(path), receipt)
    assert read_receipt(str(path)) == receipt
    text = path.read_text()
    assert text.startswith('{\n "cells": [\n  {\n   "acceptance"'), "sorted keys, indent 1"
    assert text.endswith("}\n")


def test_csv_beside_json(tmp_path, receipt):
    write_receipt(str(tmp_path / "run.json"), receipt)
    assert sorted(os.listdir(tmp_path)) == ["run.csv", "run.json"]
    lines = (tmp_path / "run.csv").read_text().splitlines()
    assert len(lines) == 1 + len(receipt["cells"])
    header = lines[0].split(",")
    assert header[:3] == ["order", "id", "model"]
    for name in ("digests.logits", "verdict.status", "acceptance.per_position", "timings.prime_s", "tape",
                 "variant_args.split"):
        assert name in header
    rows = {row["id"]: row for row in csv.DictReader(io.StringIO((tmp_path / "run.csv").read_text()))}
    row = rows["tiny/p130/split@64/k2/greedy"]
    assert row["tape"] == '[["mtp-trunk",64],["mtp-trunk",64],["mtp-trunk",2],["mtp-draft-fill",130]]'
    assert json.loads(row["continuation.tokens"]) == find_cell(receipt, row["id"])["continuation"]["tokens"]
    assert row["verdict.bound"] == "" and row["variant_args.split"] == "64"


def test_load_json_and_csv_give_the_same_frame(tmp_path, receipt):
    path = tmp_path / "run.json"
    write_receipt(str(path), receipt)
    from_json, from_csv, from_dict = load(str(path)), load(str(tmp_path / "run.csv")), load(receipt)
    assert from_json.equals(from_csv) and from_json.equals(from_dict)
    assert len(from_json) == len(receipt["cells"])
    assert list(from_json["id"]) == [c["id"] for c in receipt["cells"]]
    row = from_json.set_index("id").loc["tiny/p130/split@64/k2/greedy"]
    cell = find_cell(receipt, "tiny/p130/split@64/k2/greedy")
    assert row["tape"] == cell["tape"]
    assert row["acceptance.per_position"] == cell["acceptance"]["per_position"]
    assert row["digests.logits"] == cell["digests"]["logits"]
    assert row["k"] == 2 and row["variant_args.split"] == 64
    assert from_json["chunk_rows"].isna().sum() == sum(c["chunk_rows"] is None for c in receipt["cells"])


def test_digest_that_looks_like_a_number_stays_text(tmp_path, receipt):
    receipt["cells"][0]["digests"]["logits"] = "1" * 64
    write_receipt(str(tmp_path / "run.json"), receipt)
    assert load(str(tmp_path / "run.csv"))["digests.logits"][0] == "1" * 64


def test_failed_write_leaves_the_old_files_and_no_temp(tmp_path, receipt, monkeypatch):
    path = tmp_path / "run.json"
    write_receipt(str(path), receipt)
    before = {name: (tmp_path / name).read_bytes() for name in os.listdir(tmp_path)}
    newer = copy.deepcopy(receipt)
    newer["cells"][0]["digests"]["logits"] = "0" * 64

    def broken_fsync(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", broken_fsync)
    with pytest.raises(PrimewalkError) as e:
        write_receipt(str(path), newer)
    assert "No space left" in one_line(e)
    monkeypatch.undo()
    assert {name: (tmp_path / name).read_bytes() for name in os.listdir(tmp_path)} == before
    assert read_receipt(str(path)) == receipt


def test_unserialisable_receipt_touches_nothing(tmp_path, receipt):
    path = tmp_path / "run.json"
    write_receipt(str(path), receipt)
    before = path.read_bytes()
    bad = copy.deepcopy(receipt)
    bad["cells"][3]["verdict"]["max_abs"] = float("nan")
    with pytest.raises(PrimewalkError) as e:
        write_receipt(str(path), bad)
    assert "cannot be written as JSON" in one_line(e)
    assert path.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["run.csv", "run.json"]


@pytest.mark.parametrize("breakage, message", [
    (lambda r: r.pop("spec_hash"), "no 'spec_hash'"),
    (lambda r: r["model"].pop("weights_sha256"), "'model' needs"),
    (lambda r: r["cells"][2].pop("oracle"), "lacks 'oracle'"),
    (lambda r: r["cells"][2]["digests"].pop("captures"), "'digests' needs"),
    (lambda r: r["cells"][2]["verdict"].update(status="close"), "verdict status 'close'"),
    (lambda r: r["cells"].append(copy.deepcopy(r["cells"][0])), "duplicate cell id"),
    (lambda r: r["spec"].update(k=[9]), "spec_hash does not match"),
    (lambda r: r.update(shard={"index": 2, "count": 2}), "'shard' must be"),
])
def test_write_refuses_an_invalid_receipt(tmp_path, receipt, breakage, message):
    breakage(receipt)
    with pytest.raises(PrimewalkError) as e:
        write_receipt(str(tmp_path / "run.json"), receipt)
    assert message in one_line(e)
    assert os.listdir(tmp_path) == []


# --- read errors ----------------------------------------------------------------------------


def test_read_errors_are_one_line(tmp_path):
    with pytest.raises(PrimewalkError) as e:
        read_receipt(str(tmp_path / "missing.json"))
    assert "cannot read receipt" in one_line(e)
    (tmp_path / "junk.json").write_text("{not json")
    with pytest.raises(PrimewalkError) as e:
        read_receipt(str(tmp_path / "junk.json"))
    assert "is not JSON" in one_line(e)
    (tmp_path / "list.json").write_text("[1, 2]")
    with pytest.raises(PrimewalkError) as e:
        read_receipt(str(tmp_path / "list.json"))
    assert "not a primewalk receipt" in one_line(e)
    (tmp_path / "half.json").write_text(json.dumps({"schema_version": SCHEMA_VERSION, "cells": []}))
    with pytest.raises(PrimewalkError) as e:
        read_receipt(str(tmp_path / "half.json"))
    assert "not a receipt (no 'kind')" in one_line(e)


@pytest.mark.parametrize("source, spec_arg", [("specs/default.toml", "specs/default.toml"), (None, "default")])
def test_old_schema_is_refused_with_the_regenerate_command(tmp_path, source, spec_arg):
    old = make_receipt(source=source)
    old["schema_version"] = 0
    path = tmp_path / "golden.json"
    path.write_text(json.dumps(old))
    with pytest.raises(PrimewalkError) as e:
        read_receipt(str(path))
    text = one_line(e)
    assert "schema 0" in text
    assert f"harness run-matrix --spec {spec_arg} --out {path}" in text


def test_read_receipt_accepts_the_csv_path(tmp_path, receipt):
    write_receipt(str(tmp_path / "run.json"), receipt)
    assert read_receipt(str(tmp_path / "run.csv")) == receipt


# --- spec hash, env, field roles ------------------------------------------------------------


def test_spec_hash_is_canonical_and_ignores_backend():
    spec = {"prompts": {"p17": 17}, "k": [1, 2], "backend": "cpu"}
    expected = hashlib.sha256(b'{"k":[1,2],"prompts":{"p17":17}}').hexdigest()
    assert spec_hash(spec) == expected
    assert spec_hash({"backend": "cuda", "k": [1, 2], "prompts": {"p17": 17}}) == expected
    assert spec_hash({**spec, "k": [2, 1]}) != expected
    assert make_receipt()["spec_hash"] == make_receipt(backend="cuda")["spec_hash"]


def test_env_info(monkeypatch):
    env = env_info("cpu")
    assert set(env) == {"git_sha", "git_dirty", "python", "numba", "numpy", "platform", "backend",
                        "device", "driver"}
    assert env["backend"] == "cpu" and env["device"] and env["driver"] is None
    assert env["git_sha"] is None or len(env["git_sha"]) == 40
    assert env_info("cuda", device="NVIDIA H200", driver="570.1")["device"] == "NVIDIA H200"
    monkeypatch.setenv("PATH", "")  # no git at all
    env = env_info("cpu")
    assert env["git_sha"] is None and env["git_dirty"] is None
    json.dumps(env)


def test_field_roles_table():
    assert field_role("cell", "digests.logits") == COMPARED
    assert field_role("cell", "acceptance.histogram") == COMPARED
    assert field_role("cell", "timings.prime_s") == INFORMATIONAL
    assert field_role("receipt", "model.path") == INFORMATIONAL
    assert field_role("cell", "acceptance.per_position") is None
    cell = make_receipt()["cells"][0]
    assert set(compared_fields(cell)) == {
        "digests.captures", "digests.continuation", "digests.final_state", "digests.logits", "verdict.status",
        "tape", "yields", "continuation.tokens", "acceptance.drafts", "acceptance.accepted",
        "acceptance.histogram"}
    assert set(compared_fields(cell, digests_only=True)) == {
        "digests.captures", "digests.continuation", "digests.final_state", "digests.logits"}


# --- merge ----------------------------------------------------------------------------------


def shards(n=3, **kw):
    return [make_receipt(shard=(i, n), **kw) for i in range(n)]


def test_merge_restores_the_whole_run_in_spec_order(tmp_path):
    whole = make_receipt()
    parts = shards()
    random.Random(1).shuffle(parts)
    merged = merge_receipts(parts)
    assert merged["cells"] == whole["cells"]
    assert merged["shard"] == {"index": 0, "count": 1}
    assert [m["index"] for m in merged["merged_from"]] == [0, 1, 2]
    path = tmp_path / "merged.json"
    write_receipt(str(path), merged)
    assert read_receipt(str(path))["cells"] == whole["cells"]


def test_merge_reads_paths_and_orders_by_id_without_order(tmp_path):
    paths = []
    for i, part in enumerate(shards(2)):
        for cell in part["cells"]:
            del cell["order"]
        paths.append(str(tmp_path / f"s{i}.json"))
        write_receipt(paths[-1], part)
    merged = merge_receipts(paths)
    ids = [c["id"] for c in merged["cells"]]
    assert ids == sorted(ids) and len(ids) == len(make_receipt()["cells"])


def _other_spec(parts):
    parts[1] = make_receipt(shard=(1, 3), prompts={"p17": 17})


def _other_model(parts):
    parts[1]["model"]["weights_sha256"] = "e" * 64


def _other_schema(parts):
    parts[2]["schema_version"] = 1  # an older schema: readable, but not mergeable with 2


def _stolen_cell(parts):
    parts[1]["cells"].append(copy.deepcopy(parts[0]["cells"][0]))


def _repeated_shard(parts):
    parts[2] = copy.deepcopy(parts[1])


def _missing_shard(parts):
    del parts[1]


def _other_backend(parts):
    parts[1] = make_receipt(shard=(1, 3), backend="cuda")


@pytest.mark.parametrize("breakage, message", [
    (_other_spec, "spec_hash"),
    (_other_model, "weights_sha256"),
    (_other_schema, "schema_version 1"),
    (_stolen_cell, "is in shard 0 and shard 1"),
    (_repeated_shard, "shard 1 of 3 given more than once"),
    (_missing_shard, "shard(s) 1 of 3 missing"),
    (_other_backend, "backend"),
])
def test_merge_refusals(breakage, message):
    parts = shards()
    breakage(parts)
    with pytest.raises(PrimewalkError) as e:
        merge_receipts(parts)
    assert message in one_line(e)
    assert one_line(e).startswith("merge:")


def test_merge_of_nothing():
    with pytest.raises(PrimewalkError):
        merge_receipts([])


def test_module_constants():
    assert receipts.SCHEMA_VERSION == 2
    assert receipts.READABLE_SCHEMAS == (1, 2)


def test_other_kinds_of_receipt_are_named(tmp_path):
    path = tmp_path / "device-check.json"
    path.write_text(json.dumps({"kind": "device-check", "schema_version": 1, "ops": []}))
    with pytest.raises(PrimewalkError) as e:
        read_receipt(str(path))
    assert "a 'device-check' receipt, not a 'matrix' receipt" in one_line(e)
