"""Which tokenizer turns a checkpoint's text prompts into ids, and its ids back into text.

One rule per checkpoint folder, applied by :func:`load_tokenizer`:

1. ``tokenizer.json`` in the folder: the checkpoint's own tokenizer, read with HF's
   ``tokenizers`` library. Prompts are encoded with its post-processor (``add_special_tokens``,
   what transformers' fast tokenizer does by default). An optional ``tokenizer_config.json``
   names the special tokens (``bos_token``, ``eos_token``, ``pad_token``, ``unk_token``; strings
   or ``{"content": ...}`` tables) and may ask for ``add_bos_token`` / ``add_eos_token``: the
   BOS (EOS) id is put at the start (end) of an encoding that lacks it.
2. No ``tokenizer.json`` and a vocabulary of :data:`BYTE_VOCAB` = 256..260 ids: the byte
   tokenizer (:mod:`harness.tokenizer`: UTF-8 bytes, then ``<bos>``, ``<eos>``, ``<pad>`` and a
   spare id). The embedded ``tiny`` and ``stdlib-small`` models are byte models.
3. Neither: the model has no tokenizer, and text prompts are refused in one line (token ids
   still work) -- primewalk never guesses.

A tokenizer whose ids do not fit the model's ``vocab_size`` is refused at load. Receipts record
:meth:`Tokenizer.describe`: ``{"name": "byte"}`` or ``{"name": "tokenizer.json", "model": "BPE",
"tokens": N, "sha256": <of tokenizer.json>, "config_sha256": <of tokenizer_config.json or
None>, "special": {...}}``.
"""

from __future__ import annotations

import hashlib
import json
import os

from .. import tokenizer as byte_tokenizer
from ..errors import CheckpointError, InputError

#: Vocabulary sizes that mean "byte model" when a folder has no tokenizer.json: the 256 bytes,
#: plus up to the byte tokenizer's BOS, EOS, PAD and spare ids.
BYTE_VOCAB = range(256, byte_tokenizer.VOCAB_SIZE + 1)
TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
SPECIAL_NAMES = ("bos_token", "eos_token", "pad_token", "unk_token")


class ByteTokenizer:
    """UTF-8 bytes as ids 0..255 (no BOS added); ids 256.. decode as ``<bos>``, ``<eos>``, ..."""

    name = "byte"
    sha256 = None

    def encode(self, text: str) -> list[int]:
        return byte_tokenizer.encode(text)

    def decode(self, ids) -> str:
        return byte_tokenizer.decode(ids)

    def describe(self) -> dict:
        return {"name": self.name}


class HFTokenizer:
    """A checkpoint's ``tokenizer.json`` (+ ``tokenizer_config.json``), see the module docstring."""

    name = TOKENIZER_FILE

    def __init__(self, folder: str, vocab_size: int):
        try:
            from tokenizers import Tokenizer
        except ImportError:  # pragma: no cover - a package dependency
            raise CheckpointError("reading tokenizer.json needs the 'tokenizers' package "
                                  "(pip install tokenizers)") from None
        path = os.path.join(folder, TOKENIZER_FILE)
        raw = _read(path)
        self.sha256 = hashlib.sha256(raw).hexdigest()
        try:
            self.tok = Tokenizer.from_str(raw.decode("utf-8"))
        except Exception as e:  # tokenizers raises its own exception types
            raise CheckpointError(f"{path}: not a tokenizers file ({_first_line(e)})") from None
        self.model = type(self.tok.model).__name__
        self.size = self.tok.get_vocab_size(with_added_tokens=True)
        top = max(self.tok.get_vocab(with_added_tokens=True).values(), default=-1)
        if top >= vocab_size:
            raise CheckpointError(f"{path}: the tokenizer has ids up to {top}, the model's vocab_size "
                                  f"is {vocab_size} (is this the checkpoint's own tokenizer?)")
        self.config_sha256, self.special, self.add_bos, self.add_eos = None, {}, False, False
        cpath = os.path.join(folder, TOKENIZER_CONFIG)
        if os.path.isfile(cpath):
            self._read_config(cpath)

    def _read_config(self, cpath: str) -> None:
        raw = _read(cpath)
        self.config_sha256 = hashlib.sha256(raw).hexdigest()
        try:
            conf = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise CheckpointError(f"{cpath}: not JSON ({_first_line(e)})") from None
        if not isinstance(conf, dict):
            raise CheckpointError(f"{cpath}: expected a JSON object")
        for key in SPECIAL_NAMES:
            value = conf.get(key)
            if isinstance(value, dict):
                value = value.get("content")
            if value is None:
                continue
            if not isinstance(value, str):
                raise CheckpointError(f"{cpath}: {key}: expected a token string, got {value!r}")
            tid = self.tok.token_to_id(value)
            if tid is None:
                raise CheckpointError(f"{cpath}: {key} {value!r} is not a token of tokenizer.json")
            self.special[key.removesuffix("_token")] = {"token": value, "id": int(tid)}
        for flag in ("add_bos_token", "add_eos_token"):
            if conf.get(flag) and flag[4:7] not in self.special:
                raise CheckpointError(f"{cpath}: {flag} is true but no {flag[4:7]}_token is named")
        self.add_bos, self.add_eos = bool(conf.get("add_bos_token")), bool(conf.get("add_eos_token"))

    def encode(self, text: str) -> list[int]:
        ids = [int(i) for i in self.tok.encode(text, add_special_tokens=True).ids]
        if self.add_bos and ids[:1] != [self.special["bos"]["id"]]:
            ids.insert(0, self.special["bos"]["id"])
        if self.add_eos and ids[-1:] != [self.special["eos"]["id"]]:
            ids.append(self.special["eos"]["id"])
        return ids

    def decode(self, ids) -> str:
        return self.tok.decode([int(i) for i in ids], skip_special_tokens=False)

    def describe(self) -> dict:
        return {"name": self.name, "model": self.model, "tokens": int(self.size), "sha256": self.sha256,
                "config_sha256": self.config_sha256, "special": dict(self.special),
                "add_bos": self.add_bos, "add_eos": self.add_eos}


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise CheckpointError(f"{path}: cannot read ({e.strerror or e})") from None


def _first_line(e: Exception) -> str:
    text = str(e).strip().splitlines()
    return text[0][:200] if text else type(e).__name__


def load_tokenizer(folder: str, vocab_size: int):
    """The tokenizer of the checkpoint folder ``folder`` whose model has ``vocab_size`` ids, by
    the rule of the module docstring: an :class:`HFTokenizer`, a :class:`ByteTokenizer`, or None
    (the model has no tokenizer)."""
    if os.path.isfile(os.path.join(folder, TOKENIZER_FILE)):
        return HFTokenizer(folder, vocab_size)
    if vocab_size in BYTE_VOCAB:
        return ByteTokenizer()
    return None


def describe(tok) -> dict:
    """What a receipt records about ``tok`` (None: ``{"name": "none"}``)."""
    return tok.describe() if tok is not None else {"name": "none"}


def no_tokenizer_error(folder: str, vocab_size: int, what: str = "a text prompt") -> InputError:
    """The one-line refusal of text for a model without a tokenizer."""
    return InputError(f"{what} needs a tokenizer, and {folder} has none: no {TOKENIZER_FILE}, and "
                      f"vocab_size {vocab_size} is not a byte vocabulary ({BYTE_VOCAB.start}.."
                      f"{BYTE_VOCAB.stop - 1}); put the checkpoint's {TOKENIZER_FILE} beside its "
                      "config.json, or give token ids")


def encode_text(tok, text: str, folder: str, vocab_size: int, what: str = "a text prompt") -> list[int]:
    """``tok.encode(text)``, refusing a model without a tokenizer and an empty encoding."""
    if tok is None:
        raise no_tokenizer_error(folder, vocab_size, what)
    ids = tok.encode(text)
    if not ids:
        raise InputError(f"{what} encodes to no tokens")
    return ids
