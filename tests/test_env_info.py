"""The ``env`` block of receipts names the code: ``$PRIMEWALK_COMMIT`` wins over the checkout's
``.git`` (a GPU box's copy of the tree may carry an older ``.git`` under newer files)."""

from harness.matrix.receipts import env_info


def test_primewalk_commit_names_the_code(monkeypatch):
    monkeypatch.setenv("PRIMEWALK_COMMIT", "f" * 40)
    monkeypatch.delenv("PRIMEWALK_DIRTY", raising=False)
    e = env_info("cpu")
    assert e["git_sha"] == "f" * 40 and e["git_dirty"] is False
    monkeypatch.setenv("PRIMEWALK_DIRTY", "1")
    assert env_info("cpu")["git_dirty"] is True


def test_without_primewalk_commit_the_checkout_is_read(monkeypatch):
    monkeypatch.delenv("PRIMEWALK_COMMIT", raising=False)
    e = env_info("cpu")
    assert e["git_sha"] is None or len(e["git_sha"]) == 40
    assert e["backend"] == "cpu" and e["python"]
