"""Drafting among a draft vocabulary (``harness.engine.draft``) on the CPU twin: the draft logits
are the full head's columns at those ids bit for bit (exact and exact-bf16, untied and tied
heads), a draft is the lowest id among equal maxima, greedy speculative output equals plain
greedy whatever the vocabulary, and bad vocabularies are one-line errors. The CUDA side is the
device walker's ``spec-draft-vocab`` cases (``harness device-walker``)."""

import dataclasses
import json

import numpy as np
import pytest

from harness.cli import main as cli_main
from harness.engine.config import ModelConfig
from harness.engine.draft import digest as draft_digest
from harness.engine.draft import draft_ids, read_draft_vocab
from harness.engine.model import Engine
from harness.engine.weights import load_checkpoint
from harness.errors import InputError, NumericError, PrimewalkError
from harness.models import default_model_path
from harness.walk.mtp_walker import run_prime
from harness.walk.speculative import continue_plain, continue_spec

V = 260
ODD = [250, 3, 7, 3, 101, 5, 64]  # unsorted, a repeat: the set {3, 5, 7, 64, 101, 250}


@pytest.fixture(scope="module")
def ck():
    return load_checkpoint(default_model_path())


def tied(ck):
    """``ck`` with its lm head tied to the embedding (no lm_head.weight)."""
    cfg = dataclasses.replace(ck.config, tie_word_embeddings=True)
    assert isinstance(cfg, ModelConfig)
    return dataclasses.replace(ck, config=cfg, tensors={k: v for k, v in ck.tensors.items() if k != "lm_head.weight"})


def bits(a):
    return np.ascontiguousarray(np.asarray(a, np.float32)).view(np.uint32)


def primed(eng, n=40, seed=3):
    s = eng.new_session(n + 16)
    ids = np.random.default_rng(seed).integers(0, V, n).tolist()
    _, h = eng.prime_chunk(s, ids)
    return s, ids, eng.host(h)


def test_draft_ids_forms():
    assert draft_ids(5, V).tolist() == [0, 1, 2, 3, 4]
    assert draft_ids(ODD, V).tolist() == [3, 5, 7, 64, 101, 250]
    assert draft_ids(np.array([9, 2], np.int32), V).tolist() == [2, 9]
    assert draft_ids(V, V).size == V


@pytest.mark.parametrize("bad, msg", [(0, "outside 1..260"), (V + 1, "outside 1..260"), ([], "non-empty flat list"),
                                      ([[1, 2]], "non-empty flat list"), ([1.5], "non-empty flat list"),
                                      ([True, False], "non-empty flat list"), ([-1], "token id -1"),
                                      ([3, V], "token id 260"), ("12", "non-empty flat list")])
def test_draft_ids_refuses(bad, msg):
    with pytest.raises(InputError, match=msg):
        draft_ids(bad, V)


def test_read_draft_vocab_files(tmp_path):
    assert read_draft_vocab(None, V) is None  # the option not given: the whole vocabulary
    assert read_draft_vocab("7", V).tolist() == list(range(7))
    j = tmp_path / "ids.json"
    j.write_text(json.dumps(ODD))
    assert read_draft_vocab(str(j), V).tolist() == [3, 5, 7, 64, 101, 250]
    t = tmp_path / "ids.txt"
    t.write_text("# counted on a corpus\n250, 3\n7 3\n\n101\t5 64\n")
    assert read_draft_vocab(str(t), V).tolist() == [3, 5, 7, 64, 101, 250]
    for text, msg in (("1 2 x3", "'x3' is not a token id"), ("[1, 2", "not valid JSON"), ("1 999", "token id 999"),
                      ("# nothing\n", "non-empty flat list")):
        t.write_text(text)
        with pytest.raises(InputError, match=msg):
            read_draft_vocab(str(t), V)
    with pytest.raises(InputError, match="neither a count nor a file"):
        read_draft_vocab(str(tmp_path / "missing"), V)


@pytest.mark.parametrize("mode, tie", [("exact", False), ("exact", True), ("exact-bf16", False), ("exact-bf16", True)])
def test_draft_logits_are_the_full_heads_columns(ck, mode, tie):
    """MTP rows through the draft head give the full head's logits at the draft ids, bit for bit,
    for every row of a multi-row pass (the GEMV computes each output alone, whatever its height)."""
    c = tied(ck) if tie else ck
    eng = Engine(c, "cpu", mode=mode, draft_vocab=ODD)
    ids = eng.draft_ids
    s, toks, h = primed(eng)
    full, hf = eng.mtp_rows(s, toks[-5:], h[-6:-1], len(toks) - 5)
    s2, _, _ = primed(eng)
    sub, hs = eng.mtp_rows(s2, toks[-5:], h[-6:-1], len(toks) - 5, draft=True)
    assert sub.shape == (5, len(ids))
    assert np.array_equal(bits(full[:, ids]), bits(sub))
    assert np.array_equal(bits(eng.host(hf)), bits(eng.host(hs)))  # the head's hidden rows do not move
    assert s.cache.digest() == s2.cache.digest()


def test_a_tie_drafts_the_lowest_id(ck):
    """Three draft ids whose lm-head rows are equal tie exactly: the draft is the lowest id, in
    whatever order the vocabulary was given."""
    w = np.array(ck.tensors["lm_head.weight"], copy=True)
    w[[11, 7, 200]] = w[3]
    eng = Engine(dataclasses.replace(ck, tensors={**ck.tensors, "lm_head.weight": w}), "cpu", draft_vocab=[200, 11, 7])
    s, toks, h = primed(eng)
    s.cache.mtp_len = s.cache.pos - 1
    assert eng.mtp_draft(s, toks[-2:], h[-3:-1], 3) == [7, 7, 7]


@pytest.mark.parametrize("vocab", [1, 64, ODD, V])
@pytest.mark.parametrize("k", [1, 3])
def test_greedy_spec_with_a_draft_vocab_equals_plain(ck, vocab, k):
    eng = Engine(ck, "cpu", draft_vocab=vocab)
    prompt = np.random.default_rng(k).integers(0, V, 70).tolist()
    s = eng.new_session(120)
    spec = continue_spec(eng, s, run_prime(eng, s, prompt, k).prepared, 20, k)
    s2 = eng.new_session(120)
    plain = continue_plain(eng, s2, run_prime(eng, s2, prompt, k).prepared, 20)
    assert spec.tokens == plain.tokens
    if vocab == V:  # the whole vocabulary as a draft vocabulary drafts what no draft vocabulary does
        eng.set_draft_vocab(None)
        s3 = eng.new_session(120)
        full = continue_spec(eng, s3, run_prime(eng, s3, prompt, k).prepared, 20, k)
        assert full.metrics == spec.metrics


def test_drafts_follow_the_vocabulary_set_last(ck):
    """Drafts are ids of the draft vocabulary, the full head's argmax over them, and set_draft_vocab
    switches (and None restores) the vocabulary on a live engine."""
    eng = Engine(ck, "cpu")
    s, toks, h = primed(eng)
    snap = s.cache.snapshot()
    full, _ = eng.mtp_rows(s, toks[-2:], h[-3:-1], s.cache.pos - 1, logits_rows=1)
    want_full = int(np.argmax(full[-1]))
    for vocab in (ODD, [want_full], None, list(range(0, V, 2))):
        eng.set_draft_vocab(vocab)
        s.cache.restore(snap)
        s.cache.mtp_len = s.cache.pos - 1
        got = eng.mtp_draft(s, toks[-2:], h[-3:-1], 1)[0]
        ids = np.arange(V) if vocab is None else draft_ids(vocab, V)
        assert got == int(ids[int(np.argmax(full[-1][ids]))])
    assert eng.draft_ids is not None and eng.draft_ids.size == V // 2


def test_a_model_without_mtp_refuses_a_draft_vocab(ck):
    bare = dataclasses.replace(ck, tensors={k: v for k, v in ck.tensors.items() if not k.startswith("mtp.")})
    with pytest.raises(PrimewalkError, match="no MTP head.*a draft vocabulary"):
        Engine(bare, "cpu", draft_vocab=8)


def test_generate_cli_with_a_draft_vocab(capsys, tmp_path):
    args = ["generate", "--ids", "5,9,17,33,2", "--max-new-tokens", "12", "--k", "2", "--no-warmup"]
    assert cli_main(args + ["--plain"]) == 0
    plain = capsys.readouterr().out
    f = tmp_path / "ids.txt"
    f.write_text(" ".join(map(str, ODD)))
    for dv in ("16", str(f)):
        assert cli_main(args + ["--draft-vocab", dv]) == 0
        out, err = capsys.readouterr()
        assert out == plain
        assert "draft vocabulary" in err
    assert cli_main(args + ["--draft-vocab", "0"]) == 2
    assert "outside 1..260" in capsys.readouterr().err
    assert cli_main(args + ["--plain", "--draft-vocab", "8"]) == 2
    assert "--plain drafts nothing" in capsys.readouterr().err


@pytest.mark.parametrize("mode", ["exact", "exact-bf16"])
@pytest.mark.parametrize("vocab", [None, ODD])
def test_chained_drafts_are_the_stepwise_passes(ck, mode, vocab):
    """mtp_draft (each pass picking on the device for the next) drafts what mtp_rows passes with
    the host's argmax between them draft, and leaves the same cache: first passes of 1, 2 and 5
    rows, chains of 1, 3 and 4."""
    eng = Engine(ck, "cpu", mode=mode, draft_vocab=vocab)
    for n, k in ((1, 1), (2, 3), (5, 4)):
        s, toks, h = primed(eng, seed=n)
        s.cache.mtp_len = s.cache.pos + 1 - n
        snap = s.cache.snapshot()
        got = eng.mtp_draft(s, toks[-n:], h[-n - 1:-1], k)
        d, m = s.cache.digest(), s.cache.mtp_len
        s.cache.restore(snap)
        assert got == eng._draft_stepwise(s, toks[-n:], h[-n - 1:-1], k), (n, k)
        assert s.cache.digest() == d and s.cache.mtp_len == m == s.cache.pos + 1, (n, k)
        if vocab is not None:
            assert set(got) <= set(ODD)


def test_a_nan_in_a_chained_draft_raises(ck):
    eng = Engine(ck, "cpu")
    s, toks, h = primed(eng)
    s.cache.mtp_len = s.cache.pos - 1
    h = h.copy()
    h[-2, 0] = np.nan  # the first pass's last row: its draft and every later pass are NaN
    with pytest.raises(NumericError, match="^mtp.layers.0 produced NaN or Inf"):
        eng.mtp_draft(s, toks[-2:], h[-3:-1], 3)
    with pytest.raises(InputError, match="session unusable: mtp.layers.0 produced NaN"):
        eng.decode_step(s, 1)


def test_captures_of_an_older_draft_vocabulary_are_dropped(ck):
    """A cache's captures of draft passes carry the engine's draft generation; setting another
    vocabulary makes the next draft call drop the old ones (and what they hold: the old head)."""
    eng = Engine(ck, "cpu", draft_vocab=ODD)
    s, toks, h = primed(eng)
    c = s.cache
    other = ("decode", 1)
    c.graphs.update({("draft", 2, "draft", eng._draft_gen): "g", ("mtp", 1, "draft", eng._draft_gen, 1): "g",
                     other: "keep"})
    c.graph_seen.update({("draft+", 2, "draft", eng._draft_gen, 1), other})
    c.logit_rings[("mtp", 1, "draft", eng._draft_gen, 1)] = ["ring"]
    eng._drop_old_drafts(c)
    assert len(c.graphs) == 3  # the generation is current: nothing dropped
    eng.set_draft_vocab(16)
    c.mtp_len = c.pos - 1
    eng.mtp_draft(s, toks[-2:], h[-3:-1], 2)
    assert c.graphs == {other: "keep"} and c.graph_seen == {other} and c.logit_rings == {}
    assert c.draft_gen == eng._draft_gen


def test_run_matrix_with_a_draft_vocab_keeps_every_greedy_digest(tmp_path, capsys):
    """The tiny matrix drafting among 32 ids, against its golden receipt (no draft vocabulary):
    every greedy cell's digests equal; a sampled cell's continuation and final state move with
    the drafts (README); the receipt records the vocabulary, its spec hash is the golden's."""
    from harness.matrix.diff import diff_receipts
    from harness.matrix.receipts import read_receipt

    out = tmp_path / "dv.json"
    assert cli_main(["run-matrix", "--spec", "harness/specs/tiny.toml", "--draft-vocab", "32", "--out", str(out),
                     "--quiet", "--no-plots"]) == 0
    r = read_receipt(str(out))
    assert r["env"]["draft_vocab"] == {"size": 32, "ids_sha256": draft_digest(np.arange(32))}
    res = diff_receipts("receipts/golden/tiny.json", str(out), digests_only=True)
    assert not res.unusable
    moved = {(row.cell.split("/")[-1], row.field) for row in res.rows}
    assert moved and moved <= {("t0.7", "digests.continuation"), ("t0.7", "digests.final_state")}, moved
    assert cli_main(["run-matrix", "--spec", "harness/specs/tiny.toml", "--draft-vocab", "32", "--workers", "2",
                     "--out", str(tmp_path / "w.json")]) == 2
    assert "--draft-vocab applies to one process" in capsys.readouterr().err


def test_ranked_breaks_ties_by_id_and_fills_with_unseen_ids():
    import collections

    from harness.cli.draftvocab import ranked

    c = collections.Counter({7: 3, 2: 3, 9: 5, 4: 1})
    assert ranked(c, 3) == [9, 2, 7]
    assert ranked(c, 6) == [9, 2, 7, 4, 0, 1]


def test_draft_vocab_command_counts_a_corpus(tmp_path, capsys):
    """harness draft-vocab on a byte-level model: the most frequent bytes of the corpus, written
    as a file generate / run-matrix --draft-vocab read; bad input exits 2 in one line."""
    corpus = tmp_path / "c"
    corpus.mkdir()
    (corpus / "a.txt").write_text("aaaa bbb cc\n")
    (corpus / "b.md").write_text("aaa\n")
    (corpus / "skip.bin").write_text("zzzzzzzzzzzzzzzzzzzz")
    out = tmp_path / "dv.txt"
    assert cli_main(["draft-vocab", "--model", "stdlib-small", "--corpus", str(corpus), "--size", "5",
                     "--out", str(out)]) == 0
    assert "5 ids covering" in capsys.readouterr().out
    want = [ord("a"), ord("b"), ord("\n"), ord(" "), ord("c")]  # 7, 3, 3 (10 < 32), 2, 2 (32 < 99)
    assert [int(w) for ln in out.read_text().splitlines() if not ln.startswith("#") for w in ln.split()] == want
    assert read_draft_vocab(str(out), V).tolist() == sorted(want)
    for argv, msg in ((["--corpus", str(tmp_path / "none"), "--size", "5"], "no such file or folder"),
                      (["--corpus", str(corpus), "--size", "0"], "outside 1..260"),
                      (["--corpus", str(corpus), "--ext", ".csv", "--size", "5"], "no files")):
        assert cli_main(["draft-vocab", "--model", "stdlib-small", "--out", str(tmp_path / "x.txt")] + argv) == 2
        assert msg in capsys.readouterr().err


def test_tools_time_drafts_among_a_draft_vocabulary(tmp_path, capsys):
    """tools/spec_cost.py --draft-vocab and tools/probe_draft.py on the CPU twin: they run, and the
    probe's first draft is the full head's argmax over each draft vocabulary."""
    import importlib.util
    import os

    def tool(name):
        path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools", name + ".py")
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod

    assert tool("spec_cost").main(["--model", default_model_path(), "--draft-vocab", "16", "--k", "2",
                                   "--prompt-len", "16", "--repeat", "1"]) == 0
    assert "drafts among 16 ids" in capsys.readouterr().out
    out = tmp_path / "p.json"
    assert tool("probe_draft").main(["--out", str(out), "--sizes", "64,16", "--ks", "1,3", "--backend", "cpu",
                                     "--model", default_model_path()]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [(r["draft_vocab"], r["k"]) for r in rows] == [(V, 1), (V, 3), (64, 1), (64, 3), (16, 1), (16, 3)]
    assert [r.get("first_draft_is_full_argmax_over_ids") for r in rows if r["k"] == 3] == [None, True, True]
    # the host's share: measured for every row, never more than the step it is part of
    assert all(0 < r["issue_ms"] <= r["draft_step_ms"] for r in rows), rows
    # and what follows the wait (the picks' download); no graph replays on the CPU
    assert all(0 < r["after_sync_ms"] <= r["draft_step_ms"] for r in rows), rows
    assert all(r["first_replay_ms"] is None for r in rows), rows
    # the host's functions of K = 3 draft steps among 16 ids, by own time: mtp_draft among them
    assert tool("probe_draft").main(["--out", str(out), "--sizes", "16", "--ks", "3", "--backend", "cpu",
                                     "--model", default_model_path(), "--profile-calls", "2"]) == 0
    prof = json.loads(out.read_text())["profile"]
    assert (prof["k"], prof["draft_vocab"], prof["calls"]) == (3, 16, 2)
    fns = prof["functions"]
    assert 0 < len(fns) <= 40 and [f["own_us"] for f in fns] == sorted((f["own_us"] for f in fns), reverse=True)
    assert any("mtp_draft" in f["function"] and f["calls"] == 1 for f in fns) or \
        any("_draft_stepwise" in f["function"] for f in fns)
    assert tool("probe_draft").main(["--out", str(out), "--sizes", "16", "--backend", "cpu", "--ncu-step", "3",
                                     "--model", default_model_path()]) == 0
    assert "profiled one 3-draft step among 16 ids" in capsys.readouterr().out


def test_bisect_runs_both_sides_with_a_draft_vocab(capsys):
    """harness bisect --draft-vocab: two schedules drafting among 16 ids part nowhere (their
    traces include the MTP passes' stepwise drafts), and an injected fault is still found."""
    args = ["bisect", "--prompt-len", "70", "--a", "batched", "--b", "tokenwise", "--k", "2", "--draft-vocab", "16"]
    assert cli_main(args) == 0
    assert capsys.readouterr().out.startswith("no divergence")
    assert cli_main(args + ["--fault", "2:recurrence:60"]) == 1
    assert "first divergence: layer=2 op=recurrence row=60" in capsys.readouterr().out
    assert cli_main(["bisect", "--spec", "harness/specs/tiny.toml", "--cell", "tiny/p130/split@64/k2/greedy",
                     "--draft-vocab", "32"]) == 0
    assert cli_main(["bisect", "--list-ops", "--draft-vocab", "4"]) == 2
    assert "not --draft-vocab" in capsys.readouterr().err
