"""Bring your own model and prompts (issue #13): a random Qwen3-Next checkpoint with its own
``tokenizer.json`` (byte-level BPE trained here with HF ``tokenizers``) runs ``logits``,
``generate`` and ``run-matrix`` on text prompts, and every id primewalk feeds the model is the
tokenizer's own encoding, checked against the ``tokenizers`` library directly. A model without a
tokenizer refuses text in one line; the byte models keep the byte tokenizer."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys

import numpy as np
import pytest
from tokenizers import Tokenizer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import own_checkpoint as oc  # noqa: E402

from harness.cli import main  # noqa: E402
from harness.engine.model import Engine  # noqa: E402
from harness.engine.tokenizer import ByteTokenizer, HFTokenizer, load_tokenizer  # noqa: E402
from harness.engine.weights import load_checkpoint  # noqa: E402
from harness.errors import PrimewalkError  # noqa: E402
from harness.models import default_model_path, model_path  # noqa: E402
from harness.walk.sampling import Sampling  # noqa: E402
from harness.walk.speculative import generate  # noqa: E402

PROMPT = "Hello there, prime walker."


@pytest.fixture(scope="module")
def own(tmp_path_factory):
    folder = str(tmp_path_factory.mktemp("own") / "ckpt")
    oc.build(folder)
    return folder


def reference_ids(folder: str, text: str) -> list[int]:
    """The ids straight from the tokenizers library (not through primewalk)."""
    return Tokenizer.from_file(os.path.join(folder, "tokenizer.json")).encode(text).ids


def run(capsys, *argv):
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def one_line_error(rc, err, command, match):
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1, err
    assert lines[0].startswith(f"harness {command}: error:") and match in lines[0], lines[0]
    assert "Traceback" not in err


# ------------------------------------------------------------------------------------------------
# the tokenizer rule
# ------------------------------------------------------------------------------------------------
def test_tokenizer_rule(own, tmp_path):
    ck = load_checkpoint(own)
    tok = load_tokenizer(own, ck.config.vocab_size)
    assert isinstance(tok, HFTokenizer)
    assert tok.encode(PROMPT) == reference_ids(own, PROMPT)
    assert tok.encode(PROMPT) != list(PROMPT.encode())  # not bytes
    assert tok.decode(tok.encode(PROMPT)) == PROMPT
    d = tok.describe()
    assert d["sha256"] == hashlib.sha256(open(os.path.join(own, "tokenizer.json"), "rb").read()).hexdigest()
    assert d["special"]["eos"] == {"token": "<|im_end|>", "id": Tokenizer.from_file(
        os.path.join(own, "tokenizer.json")).token_to_id("<|im_end|>")}
    # the byte models: no tokenizer.json and a byte vocabulary
    for name in ("tiny", "stdlib-small"):
        folder = model_path(name)
        assert isinstance(load_tokenizer(folder, load_checkpoint(folder).config.vocab_size), ByteTokenizer)
    # neither: no tokenizer at all
    bare = tmp_path / "bare"
    shutil.copytree(own, bare)
    os.remove(bare / "tokenizer.json")
    assert load_tokenizer(str(bare), ck.config.vocab_size) is None


def test_tokenizer_config_bos_and_bad_files(own, tmp_path):
    folder = tmp_path / "bos"
    shutil.copytree(own, folder)
    tok = oc.train_tokenizer()
    oc.write_tokenizer(str(folder), tok, {"bos_token": "<|im_start|>", "eos_token": {"content": "<|im_end|>"},
                                          "add_bos_token": True})
    ht = load_tokenizer(str(folder), oc.VOCAB)
    bos = tok.token_to_id("<|im_start|>")
    assert ht.encode(PROMPT) == [bos] + tok.encode(PROMPT).ids
    oc.write_tokenizer(str(folder), tok, {"eos_token": "<|nope|>"})
    with pytest.raises(PrimewalkError, match="eos_token '<|nope|>' is not a token of tokenizer.json"):
        load_tokenizer(str(folder), oc.VOCAB)
    oc.write_tokenizer(str(folder), tok, {})
    with pytest.raises(PrimewalkError, match="the tokenizer has ids up to 299, the model's vocab_size is 200"):
        load_tokenizer(str(folder), 200)
    (folder / "tokenizer.json").write_text("{not json")
    with pytest.raises(PrimewalkError, match="tokenizer.json: not a tokenizers file"):
        load_tokenizer(str(folder), oc.VOCAB)


# ------------------------------------------------------------------------------------------------
# logits, generate
# ------------------------------------------------------------------------------------------------
def test_logits_on_text_uses_the_tokenizer(own, tmp_path, capsys):
    out = tmp_path / "logits.npy"
    rc, stdout, err = run(capsys, "logits", "--model", own, "--text", PROMPT, "--backend", "cpu", "--out", out)
    assert rc == 0, err
    ids = reference_ids(own, PROMPT)
    logits = np.load(out)
    assert logits.shape == (len(ids), oc.VOCAB) and logits.dtype == np.float32
    eng = Engine(load_checkpoint(own), "cpu")
    want, _ = eng.target_step(eng.new_session(len(ids)), np.asarray(ids))
    assert np.array_equal(logits.view(np.uint32), want.view(np.uint32))  # bitwise: the same ids, the same op


def test_generate_on_text_decodes_through_the_tokenizer(own, capsys):
    rc, stdout, err = run(capsys, "generate", "--model", own, "--text", PROMPT, "--max-new-tokens", 10,
                          "--k", 2)
    assert rc == 0, err
    ids = reference_ids(own, PROMPT)
    eng = Engine(load_checkpoint(own), "cpu")
    res, _ = generate(eng, ids, 10, 2, Sampling())
    tok = Tokenizer.from_file(os.path.join(own, "tokenizer.json"))
    assert stdout == tok.decode(res.tokens, skip_special_tokens=False) + "\n"
    assert f"prime {len(ids)} tokens" in err and "warm-up" in err


def test_model_without_a_tokenizer_refuses_text(own, tmp_path, capsys):
    bare = tmp_path / "bare"
    shutil.copytree(own, bare)
    os.remove(bare / "tokenizer.json")
    for command in (["logits", "--out", tmp_path / "x.npy"], ["generate", "--max-new-tokens", 4]):
        rc, out, err = run(capsys, command[0], "--model", bare, "--text", PROMPT, *command[1:])
        one_line_error(rc, err, command[0], "--text needs a tokenizer")
        assert "vocab_size 320 is not a byte vocabulary (256..260)" in err
    assert not (tmp_path / "x.npy").exists()
    rc, out, err = run(capsys, "logits", "--model", bare, "--ids", "1,2,3", "--out", tmp_path / "x.npy")
    assert rc == 0, err  # ids still work
    spec = tmp_path / "text.toml"
    spec.write_text(f'k = [1]\nvariants = ["unyielded"]\n[models]\nbare = "{bare}"\n'
                    '[[prompts]]\nkind = "text"\ntext = "hi"\n')
    rc, out, err = run(capsys, "run-matrix", "--spec", spec, "--no-plots")
    one_line_error(rc, err, "run-matrix", "prompts[0].text: model bare: a text prompt needs a tokenizer")


# ------------------------------------------------------------------------------------------------
# run-matrix
# ------------------------------------------------------------------------------------------------
SPEC = """\
max_new_tokens = 4
k = [1]
variants = ["unyielded", {{ name = "split", at = [0.5] }}, "yielded-with-peer"]
[models]
own = "{model}"
[[prompts]]
kind = "text"
name = "long"
text = {text}
[[prompts]]
kind = "file"
path = "prompt.txt"
[[prompts]]
kind = "synthetic"
lengths = [20]
"""


def test_run_matrix_on_text_prompts_feeds_the_tokenizers_ids(own, tmp_path, capsys):
    (tmp_path / "prompt.txt").write_text(PROMPT, encoding="utf-8")
    spec = tmp_path / "own.toml"
    spec.write_text(SPEC.format(model=own, text=json.dumps(oc.LONG_TEXT)), encoding="utf-8")
    out = tmp_path / "own.json"
    rc, stdout, err = run(capsys, "run-matrix", "--spec", spec, "--out", out, "--no-plots")
    assert rc == 0, err
    r = json.loads(out.read_text())
    sha = hashlib.sha256(open(os.path.join(own, "tokenizer.json"), "rb").read()).hexdigest()
    assert r["model"]["tokenizer"]["name"] == "tokenizer.json" and r["model"]["tokenizer"]["sha256"] == sha
    want = {"long": reference_ids(own, oc.LONG_TEXT), "prompt": reference_ids(own, PROMPT)}
    seen = set()
    for c in r["cells"]:
        if c["prompt"] not in want:
            continue
        ids = want[c["prompt"]]
        assert c["prompt_len"] == len(ids) != len((oc.LONG_TEXT if c["prompt"] == "long" else PROMPT).encode())
        # the digest of the ids, computed here from the tokenizers library's ids
        assert c["digests"]["prompt"] == hashlib.sha256(b"primewalk-prompt/1\0" + np.asarray(ids, "<i8").tobytes()).hexdigest()
        assert sum(rows for phase, rows in c["tape"] if phase == "mtp-trunk") == len(ids)
        seen.add(c["id"])
    half = len(want["long"]) // 2
    assert f"own/long/split@{half}/k1/greedy" in seen  # 0.5 of a < 128-token prompt: the nearest row
    assert all(c["verdict"]["status"] == "bitwise" for c in r["cells"])
    assert {s["prompt"] for s in r["skipped"]} == {"prompt", "p20"}  # too short to split
