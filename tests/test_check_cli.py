"""``harness check`` and ``harness generate`` in-process on the CPU backend."""

import numpy as np
import pytest

import harness.walk.check as check_mod
from harness import tokenizer
from harness.cli import main
from harness.engine.weights import load_checkpoint, save_checkpoint
from harness.models import default_model_path


def run(capsys, *argv):
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def assert_one_line_error(rc, out, err, command, match):
    assert rc == 2
    assert "Traceback" not in err and "Traceback" not in out
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"harness {command}: error:")
    assert match in lines[0], lines[0]
    assert "PASS" not in out and "FAIL" not in out


def pass_line(out):
    lines = [ln for ln in out.splitlines() if ln.startswith("PASS")]
    assert len(lines) == 1, out
    return dict(kv.split("=", 1) for kv in lines[0].split()[1:])


# ------------------------------------------------------------------------------------------------
# harness check
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("argv,boundary", [
    (["--prompt-len", "130"], 64),
    (["--prompt-len", "130", "--split", "64"], 64),
    (["--prompt-len", "130", "--split", "98"], 98),  # leaves exactly PRIME_MIN_T rows
    (["--prompt-len", "257"], 128),
    (["--prompt-len", "257", "--split", "100", "--chunk-rows", "50", "--fill-chunk", "30"], 100),
    (["--prompt-len", "1000"], 448),
    (["--prompt-len", "1000", "--chunk-rows", "100", "--seed", "3"], 448),
    (["--prompt-len", "2061"], 1024),
    (["--prompt-len", "2061", "--split", "1024", "--k", "4", "--chunk-rows", "512"], 1024),
])
def test_check_passes(capsys, argv, boundary):
    rc, out, err = run(capsys, "check", *argv)
    assert rc == 0, out + err
    kv = pass_line(out)
    n = int(argv[1])
    assert kv["rows"] == str(n) and kv["boundary"] == str(boundary) and kv["backend"] == "cpu"
    assert int(kv["yields"]) > 0 and int(kv["chunks"]) == int(kv["yields"]) + 1
    assert len(kv["target_logits"]) == 64 and len(kv["boundary_state"]) == 64


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_check_passes_for_every_k(capsys, k):
    rc, out, err = run(capsys, "check", "--prompt-len", "257", "--k", str(k))
    assert rc == 0, out + err
    assert pass_line(out)["k"] == str(k)


def test_check_of_a_short_prime_cannot_yield(capsys):
    # fill_chunk >= the prompt: trunk, setup and fill run in one advance, so the check (which
    # requires yields > 0, as in the seed) reports FAIL rather than passing vacuously
    rc, out, err = run(capsys, "check", "--prompt-len", "257", "--fill-chunk", "300")
    assert rc == 1
    fails = [ln for ln in out.splitlines() if ln.startswith("FAIL")]
    assert len(fails) == 1 and "yields=0" in fails[0] and "never yielded" in fails[0]


def test_check_is_deterministic(capsys):
    a = pass_line(run(capsys, "check", "--prompt-len", "130")[1])
    b = pass_line(run(capsys, "check", "--prompt-len", "130")[1])
    c = pass_line(run(capsys, "check", "--prompt-len", "130", "--seed", "1")[1])
    assert a == b
    assert c["target_logits"] != a["target_logits"]


@pytest.mark.parametrize("argv,match", [
    (["--prompt-len", "130", "--split", "100"], "PRIME_MIN_T"),  # tail of 30 rows
    (["--prompt-len", "130", "--split", "16"], "PRIME_MIN_T"),
    (["--prompt-len", "40"], "PRIME_MIN_T"),  # default boundary 0
    (["--prompt-len", "0"], "--prompt-len must be positive"),
    (["--prompt-len", "-5"], "--prompt-len must be positive"),
    (["--prompt-len", "257", "--k", "0"], "--k must be at least 1"),
    (["--prompt-len", "257", "--k", "-1"], "--k must be at least 1"),
])
def test_check_usage_errors(capsys, argv, match):
    rc, out, err = run(capsys, "check", *argv)
    assert_one_line_error(rc, out, err, "check", match)


@pytest.fixture(scope="module")
def trunk_only_dir(tmp_path_factory):
    ck = load_checkpoint(default_model_path())
    folder = tmp_path_factory.mktemp("trunk_only_cli")
    save_checkpoint(str(folder), ck.config, {k: v for k, v in ck.tensors.items() if not k.startswith("mtp.")})
    return str(folder)


@pytest.mark.parametrize("command,extra", [("check", ["--prompt-len", "130"]), ("generate", ["--ids", "1,2,3"])])
def test_model_without_mtp_head(capsys, trunk_only_dir, command, extra):
    rc, out, err = run(capsys, command, "--model", trunk_only_dir, *extra)
    assert_one_line_error(rc, out, err, command, "no MTP head")


def _tamper(monkeypatch, how):
    real = check_mod.run_prime

    def wrapped(engine, sess, prompt, k, **kw):
        if how == "no-yield":
            kw["yield_hook"] = None
        r = real(engine, sess, prompt, k, **kw)
        if how == "logits":
            lg = r.prepared.logits.copy()
            lg[3] = np.nextafter(lg[3], np.float32(np.inf))  # one ulp
            r.prepared.logits = lg
        elif how == "capture":
            c = sess.boundary_captures[0]
            c.last_h = c.last_h.copy()
            c.last_h[0] = np.nextafter(c.last_h[0], np.float32(-np.inf))
        return r

    monkeypatch.setattr(check_mod, "run_prime", wrapped)


@pytest.mark.parametrize("how,match", [
    ("logits", "logits differ"),
    ("capture", "capture digest"),
    ("no-yield", "never yielded"),
])
def test_check_fails_on_tampered_walker(capsys, monkeypatch, how, match):
    _tamper(monkeypatch, how)
    rc, out, err = run(capsys, "check", "--prompt-len", "257")
    assert rc == 1
    assert "Traceback" not in err
    fails = [ln for ln in out.splitlines() if ln.startswith("FAIL")]
    assert len(fails) == 1 and "PASS" not in out
    assert match in fails[0]
    for other in {"logits differ", "capture digest", "never yielded"} - {match}:
        assert other not in fails[0]


# ------------------------------------------------------------------------------------------------
# harness generate
# ------------------------------------------------------------------------------------------------
def _plain_tokens(ids, n):
    from harness.engine.model import Engine
    from harness.walk.speculative import generate

    eng = Engine(load_checkpoint(default_model_path()), "cpu")
    return generate(eng, ids, n, 1, speculative=False)[0].tokens


@pytest.mark.parametrize("k", [1, 3])
def test_generate_prints_continuation_and_summary(capsys, k):
    rc, out, err = run(capsys, "generate", "--ids", "1,2,3,4,5", "--max-new-tokens", "12", "--k", str(k))
    assert rc == 0, err
    assert out == tokenizer.decode(_plain_tokens([1, 2, 3, 4, 5], 12)) + "\n"
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"[generate] K={k} greedy: 12 tokens")
    assert "tok/s" in lines[0] and "mean acceptance length" in lines[0] and "per-position" in lines[0]


def test_generate_text_plain_and_sampled(capsys):
    rc, out, err = run(capsys, "generate", "--text", "def main(", "--max-new-tokens", "10", "--plain")
    assert rc == 0, err
    assert out == tokenizer.decode(_plain_tokens(tokenizer.encode("def main("), 10)) + "\n"
    assert len(err.strip().splitlines()) == 1 and "plain greedy" in err and "tok/s" in err
    a = run(capsys, "generate", "--ids", "7,8,9", "--max-new-tokens", "10", "--temperature", "0.8", "--seed", "1")
    b = run(capsys, "generate", "--ids", "7,8,9", "--max-new-tokens", "10", "--temperature", "0.8", "--seed", "1")
    assert a[0] == b[0] == 0 and a[1] == b[1]
    assert "t0.8" in a[2]


@pytest.mark.parametrize("argv,match", [
    (["--ids", "1,x,3"], "expected comma-separated integers"),
    (["--ids", "1,260,3"], "out of range"),
    (["--ids=-1,2"], "out of range"),
    (["--ids", ","], "empty"),
    (["--text", ""], "empty"),
    (["--ids", "1,2", "--k", "0"], "--k must be at least 1"),
    (["--ids", "1,2", "--max-new-tokens", "0"], "--max-new-tokens must be positive"),
    (["--ids", "1,2", "--temperature", "-1"], "--temperature must be >= 0"),
])
def test_generate_usage_errors(capsys, argv, match):
    rc, out, err = run(capsys, "generate", *argv)
    assert_one_line_error(rc, out, err, "generate", match)
    assert out == ""


# ------------------------------------------------------------------------------------------------
# the status line of a long check
# ------------------------------------------------------------------------------------------------
class _Tty:
    """A stderr stand-in that says it is a terminal and keeps what was written."""

    def __init__(self, tty=True):
        self.tty, self.text = tty, ""

    def isatty(self):
        return self.tty

    def write(self, s):
        self.text += s

    def flush(self):
        pass


def test_check_on_a_terminal_shows_its_phases_and_leaves_the_result_alone(capsys, monkeypatch):
    """On a terminal ``check`` shows the oracle phase and the walker's chunks (d/n, the last
    one at d = n) on one status line of stderr, erased before the PASS line; the PASS line and
    its digests are those of the run without a terminal."""
    from harness.cli import progress

    plain = pass_line(run(capsys, "check", "--prompt-len", "1000")[1])
    tty = _Tty()
    real = progress.StatusLine.__init__

    def on_tty(self, prefix, stream=None, every=0.25):
        real(self, prefix, tty, every=0.0)  # every chunk shown

    monkeypatch.setattr(progress.StatusLine, "__init__", on_tty)
    rc, out, err = run(capsys, "check", "--prompt-len", "1000")
    assert rc == 0 and pass_line(out) == plain
    lines = tty.text.split("\r\033[K")
    assert lines[0] == "" and lines[-1] == ""  # each line erased the one before; the last erased
    shown = [ln for ln in lines if ln]
    assert shown[0].startswith("[check] unyielded oracle prime of 1,000 rows (0:")
    chunks = [ln.split()[3] for ln in shown[1:]]
    n = int(plain["chunks"])
    assert chunks == [f"{d}/{n}" for d in range(1, n + 1)]
    assert "left)" in shown[2] and all("elapsed" in ln for ln in shown)


def test_status_line_is_silent_off_a_terminal_and_throttles_counts():
    from harness.cli.progress import StatusLine

    off = _Tty(tty=False)
    s = StatusLine("x", off)
    s("phase")
    s("step", 1, 2)
    s.close()
    assert off.text == ""
    on = _Tty()
    s = StatusLine("x", on, every=3600.0)
    s("phase one")
    s("step", 1, 10)  # a count right after a line: held back
    s("phase two")  # a phase always shows
    s.close()
    assert [ln for ln in on.text.split("\r\033[K") if ln] == ["[x] phase one (0:00 elapsed)",
                                                              "[x] phase two (0:00 elapsed)"]
