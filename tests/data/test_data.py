"""Token shards, tokenizers, markup stripping and corpus sources (fast; data made here)."""

from __future__ import annotations

import gzip
import json
import re
import struct
import sys
import types
import zlib
from pathlib import Path

import numpy as np
import pytest

from conftest import raises_naming
from taperlm.data import corpus, readers
from taperlm.data.markup import pod_inline, pod_to_text, rst_to_text
from taperlm.data.shards import HEADER_SIZE, ShardWriter, open_shard, read_header, write_shard
from taperlm.data.tokenizer import (
    EOS_TOKEN,
    MIN_BPE_VOCAB,
    build_tokenizer,
    load_tokenizer,
    train_bpe,
)
from taperlm.errors import DataError

WORDS = (
    "the a model layer width taper budget token train data shard loss early late attention "
    "memory wide narrow every block learns something new and of to in is that with for"
).split()


def make_text(n_words: int, seed: int) -> str:
    rng = np.random.default_rng(seed)
    words = rng.choice(WORDS, size=n_words)
    sentences = [" ".join(words[i : i + 12]).capitalize() + "." for i in range(0, n_words, 12)]
    return "\n\n".join(" ".join(sentences[i : i + 5]) for i in range(0, len(sentences), 5))


# --- shards ----------------------------------------------------------------------------------


@pytest.mark.unit
def test_shard_round_trip_uint16_and_uint32(tmp_path: Path) -> None:
    small = np.arange(1000, dtype=np.int64) % 500
    h = write_shard(tmp_path / "a.bin", small, vocab_size=500)
    assert h.dtype == np.uint16 and h.count == 1000
    header, tokens = open_shard(tmp_path / "a.bin", verify=True)
    assert header == h and np.array_equal(tokens, small)
    assert (tmp_path / "a.bin").stat().st_size == HEADER_SIZE + 2000

    big = np.array([0, 65535, 65536, 69999])
    write_shard(tmp_path / "b.bin", big, vocab_size=70000)
    header, tokens = open_shard(tmp_path / "b.bin", verify=True)
    assert header.dtype == np.uint32 and np.array_equal(tokens, big)
    assert not list(tmp_path.glob("*.tmp"))  # atomic writes leave no temp files


@pytest.mark.unit
def test_shard_writer_streams_chunks_and_aborts_on_error(tmp_path: Path) -> None:
    with ShardWriter(tmp_path / "s.bin", vocab_size=10) as w:
        w.write([1, 2, 3])
        w.write(np.array([4, 5]))
    assert list(open_shard(tmp_path / "s.bin", verify=True)[1]) == [1, 2, 3, 4, 5]
    with (
        raises_naming(DataError, "t.bin", "10", "[0, 10)"),
        ShardWriter(tmp_path / "t.bin", vocab_size=10) as w,
    ):
        w.write([1, 10])
    assert not (tmp_path / "t.bin").exists() and not (tmp_path / "t.bin.tmp").exists()


@pytest.fixture
def shard(tmp_path: Path) -> Path:
    path = tmp_path / "x.bin"
    write_shard(path, np.arange(100) % 50, vocab_size=50)
    return path


def _patch(path: Path, offset: int, data: bytes) -> None:
    raw = bytearray(path.read_bytes())
    raw[offset : offset + len(data)] = data
    path.write_bytes(bytes(raw))


@pytest.mark.unit
def test_wrong_magic(shard: Path) -> None:
    _patch(shard, 0, b"NOTTAPER")
    with raises_naming(DataError, shard.name, "NOTTAPER", "taperlm prepare"):
        open_shard(shard)


@pytest.mark.unit
def test_corrupt_header_field(shard: Path) -> None:
    _patch(shard, 16, struct.pack("<Q", 99))  # token count changed, header crc now wrong
    with raises_naming(DataError, shard.name, "header", "taperlm prepare"):
        open_shard(shard)


@pytest.mark.unit
def test_unsupported_version(shard: Path) -> None:
    raw = bytearray(shard.read_bytes())
    raw[8:12] = struct.pack("<I", 7)
    raw[36:40] = struct.pack("<I", zlib.crc32(bytes(raw[:36])))  # a consistent v7 header
    shard.write_bytes(bytes(raw))
    with raises_naming(DataError, shard.name, "version 7"):
        open_shard(shard)


@pytest.mark.unit
def test_truncated_shard(shard: Path) -> None:
    shard.write_bytes(shard.read_bytes()[:-10])
    with raises_naming(DataError, shard.name, "100 tokens"):
        open_shard(shard)
    shard.write_bytes(shard.read_bytes()[:20])
    with raises_naming(DataError, shard.name, "20 bytes", f"{HEADER_SIZE}-byte", "taperlm prepare"):
        open_shard(shard)


@pytest.mark.unit
def test_bit_flip_detected_only_when_verifying(shard: Path) -> None:
    raw = bytearray(shard.read_bytes())
    raw[HEADER_SIZE + 10] ^= 0x01
    shard.write_bytes(bytes(raw))
    open_shard(shard, verify=False)  # cheap open does not read the payload
    with raises_naming(DataError, shard.name, "checksum"):
        open_shard(shard, verify=True)


@pytest.mark.unit
def test_token_id_above_vocab_detected(shard: Path) -> None:
    raw = bytearray(shard.read_bytes())
    raw[HEADER_SIZE : HEADER_SIZE + 2] = struct.pack("<H", 60)  # id 60 >= vocab 50
    payload = bytes(raw[HEADER_SIZE:])
    raw[32:36] = struct.pack("<I", zlib.crc32(payload))  # checksum consistent with the bad id
    raw[36:40] = struct.pack("<I", zlib.crc32(bytes(raw[:36])))
    shard.write_bytes(bytes(raw))
    assert read_header(shard).count == 100
    with raises_naming(DataError, "60", "vocab_size 50"):
        open_shard(shard, verify=True)


# --- tokenizers ------------------------------------------------------------------------------


@pytest.mark.unit
def test_bpe_round_trip_and_determinism(tmp_path: Path) -> None:
    texts = [make_text(400, seed) for seed in range(5)]
    tok = train_bpe(texts, 300)
    assert tok.vocab_size == 300 and tok.eos_id == 0 and tok.bos_id is None
    sample = "The taper learns something new. Ünïcode and 123!\n\tTabs too."
    assert tok.decode(tok.encode(sample)) == sample
    assert tok.encode_batch([sample, "a"]) == [tok.encode(sample), tok.encode("a")]
    assert train_bpe(texts, 300).backend.to_str() == tok.backend.to_str()

    tok.save(tmp_path / "tk")
    meta = json.loads((tmp_path / "tk" / "tokenizer_meta.json").read_text())
    assert meta["kind"] == "bpe" and meta["eos_token"] == EOS_TOKEN
    again = load_tokenizer(tmp_path / "tk")
    assert again.encode(sample) == tok.encode(sample) and again.vocab_size == 300

    with raises_naming(DataError, "bpe:lots", "bpe:N"):
        build_tokenizer("bpe:lots", texts)
    with raises_naming(DataError, "bpe:100", str(MIN_BPE_VOCAB)):
        build_tokenizer("bpe:100", texts)


def test_every_tokenizer_kind_loads_and_an_unknown_one_is_named(tmp_path: Path) -> None:
    """tokenizer_meta.json's kind is one of TokenizerKind's: each loads as written; any other
    value (a damaged or foreign file) stops with the field, the value and the allowed kinds."""
    from taperlm.data.tokenizer import TokenizerKind
    from taperlm.spec.domains import choices

    tok = train_bpe([make_text(300, 2)], 280)
    tok.save(tmp_path / "tk")
    meta_path = tmp_path / "tk" / "tokenizer_meta.json"
    meta = json.loads(meta_path.read_text())
    for kind in choices(TokenizerKind):
        meta_path.write_text(json.dumps({**meta, "kind": kind}))
        assert load_tokenizer(tmp_path / "tk").kind == kind
    for bad in ("pickle", "", "BPE"):
        meta_path.write_text(json.dumps({**meta, "kind": bad}))
        with raises_naming(
            DataError, str(meta_path), "'kind'", repr(bad), "bpe, hf, local, import"
        ):
            load_tokenizer(tmp_path / "tk")


@pytest.mark.unit
def test_gpt2_files(shared_data: Path, tmp_path: Path) -> None:
    tok = build_tokenizer(str(shared_data / "tokenizers" / "gpt2"))
    assert tok.encode("Hello world") == [15496, 995]
    assert tok.vocab_size == 50257 and tok.eos_id == 50256
    assert tok.decode([15496, 995, 50256]) == "Hello world<|endoftext|>"
    tok.save(tmp_path)
    assert load_tokenizer(tmp_path).encode("Hello world") == [15496, 995]
    # A bare tokenizer.json (no meta) also loads and finds its EOS.
    (tmp_path / "tokenizer_meta.json").unlink()
    bare = load_tokenizer(tmp_path / "tokenizer.json")
    assert bare.eos_id == 50256 and bare.vocab_size == 50257


def test_to_hf_matches(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    tok = train_bpe([make_text(300, 1)], 280)
    hf = tok.to_hf()
    text = "every block learns"
    assert hf(text)["input_ids"] == tok.encode(text)
    assert hf.eos_token_id == tok.eos_id


@pytest.mark.unit
def test_missing_tokenizer_path(tmp_path: Path) -> None:
    with raises_naming(DataError, "nope", "bpe:N"):
        build_tokenizer(str(tmp_path / "nope"))
    with raises_naming(DataError, str(tmp_path), "tokenizer.json"):
        load_tokenizer(tmp_path)


# --- markup ------------------------------------------------------------------------------------

RST = """\
.. _label:

Title of the page
=================

The :mod:`functools` module is for *higher-order* functions; see
:func:`~functools.lru_cache` and `the docs <https://example.org>`_ and :pep:`8`.

.. note::

   Notes are kept as prose.

For example::

    code_is_dropped = True

.. code-block:: python

   also_dropped()

>>> doctest_dropped()
1

+------+------+
| grid | tbl  |
+------+------+

=====  =====
col    col2
=====  =====
row    row2
=====  =====

.. versionadded:: 3.9

- first item
  continues here
- second item
"""


@pytest.mark.unit
def test_rst_to_text() -> None:
    text = rst_to_text(RST)
    assert text.split("\n\n") == [
        "Title of the page",
        "The functools module is for higher-order functions; see lru_cache and the docs and PEP 8.",
        "Notes are kept as prose.",
        "For example:",
        "New in version 3.9.",
        "- first item continues here\n- second item",
    ]


POD = """\
=head1 NAME

perlintro - a B<brief> introduction

=head2 Running

Use C<< $a <=> $b >> and L<perlfunc/"sort"> or L<the docs|perldoc>, E<lt>okE<gt>.

    my $code = "dropped";

=over

=item *

A bullet.

=back

=begin html

<p>dropped</p>

=end html

=cut

sub not_pod { }
"""


@pytest.mark.unit
def test_pod_to_text() -> None:
    assert pod_inline("X<index>I<it> C<<< a >> b >>>") == "it a >> b"
    assert pod_to_text(POD).split("\n\n") == [
        "NAME",
        "perlintro - a brief introduction",
        "Running",
        "Use $a <=> $b and sort in perlfunc or the docs, <ok>.",
        "- A bullet.",
    ]


# --- corpus sources ------------------------------------------------------------------------------


@pytest.mark.unit
def test_local_sources_and_order(tmp_path: Path) -> None:
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "z.txt").write_text("zed text\r\n")
    (tmp_path / "a.jsonl").write_text('{"text": "one"}\n\n{"text": "two", "id": 3}\n')
    (tmp_path / "ignored.bin").write_bytes(b"\0\1")
    (tmp_path / ".hidden.txt").write_text("hidden")
    docs = list(corpus.iter_local(tmp_path))
    assert [(d.name, d.text) for d in docs] == [
        ("a.jsonl:1", "one"),
        ("a.jsonl:3", "two"),
        ("b/z.txt", "zed text\n"),
    ]
    capped = list(corpus.cap_chars(docs, 5))
    assert [d.text for d in capped] == ["one", "tw"]


@pytest.mark.unit
@pytest.mark.parametrize(
    ("content", "named"),
    [
        (b"", ("empty",)),
        (b"  \n\n", ("empty",)),
        (b"text\x00\x01binary", ("binary",)),
        ("caf\u00e9".encode("latin-1"), ("UTF-8", "byte 3", "b'\\xe9'")),
        (b"ok " * 700_000 + b"\xff", ("UTF-8", "byte 2100000", "b'\\xff'")),
    ],
    ids=["empty", "blank", "binary", "latin1", "bad_byte_in_third_block"],
)
def test_bad_source_files_name_the_file(tmp_path: Path, content: bytes, named: tuple) -> None:
    (tmp_path / "good.txt").write_text("fine")
    bad = tmp_path / "zz_bad.txt"
    bad.write_bytes(content)
    with raises_naming(DataError, str(bad), *named):
        list(corpus.iter_local(tmp_path))


@pytest.mark.unit
def test_bad_jsonl_lines(tmp_path: Path) -> None:
    f = tmp_path / "x.jsonl"
    f.write_text('{"text": "ok"}\n{not json}\n')
    with raises_naming(DataError, "x.jsonl:2", "JSON"):
        list(corpus.iter_local(f))
    f.write_text('{"body": "no text field"}\n')
    with raises_naming(DataError, "x.jsonl:1", "'text'"):
        list(corpus.iter_local(f))
    f.write_bytes(b'{"text": "ok"}\n{"text": "caf\xe9"}\n')
    with raises_naming(DataError, "x.jsonl:2", "UTF-8"):
        list(corpus.iter_local(f))


@pytest.mark.unit
def test_missing_source_and_empty_folder(tmp_path: Path) -> None:
    with raises_naming(DataError, "nope", "--source default"):
        corpus.open_source(str(tmp_path / "nope"))
    with raises_naming(DataError, str(tmp_path), ".txt", ".jsonl", ".parquet"):
        corpus.open_source(str(tmp_path))
    (tmp_path / "x.csv").write_text("a,b")
    with raises_naming(DataError, "x.csv", ".jsonl"):
        corpus.open_source(str(tmp_path / "x.csv"))


@pytest.mark.unit
def test_hf_source_spec() -> None:
    assert readers.parse_hf_spec("hf:HuggingFaceFW/fineweb-edu:sample-10BT") == (
        "HuggingFaceFW/fineweb-edu",
        "sample-10BT",
    )
    assert readers.parse_hf_spec("hf:wikitext") == ("wikitext", None)
    with raises_naming(DataError, "'hf:'", "hf:NAME"):
        readers.parse_hf_spec("hf:")


@pytest.mark.unit
def test_hf_source_streams_rows_with_fake_datasets(monkeypatch) -> None:
    calls = []

    def load_dataset(name, config, split, streaming):
        calls.append((name, config, split, streaming))
        return iter([{"text": "first"}, {"text": "  "}, {"text": "third"}])

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    docs = list(corpus.open_source("hf:org/set:cfg").documents())
    assert [(d.name, d.text) for d in docs] == [("org/set:0", "first"), ("org/set:2", "third")]
    assert calls == [("org/set", "cfg", "train", True)]

    def no_text(*args, **kwargs):
        return iter([{"content": "x"}])

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=no_text))
    with raises_naming(DataError, "hf:org/set", "'text'", "columns: content"):
        list(readers.read_hf("hf:org/set", cap=100))
    assert [d.text for d, _ in readers.read_hf("hf:org/set", cap=100, field="content")] == ["x"]

    def offline(*args, **kwargs):
        raise ConnectionError("no network")

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=offline))
    with raises_naming(DataError, "internet", "--source default"):
        list(readers.read_hf("hf:org/set", cap=100))
    monkeypatch.setitem(sys.modules, "datasets", None)  # not installed
    with raises_naming(DataError, "'datasets'", "pip install 'taperlm[hf]'"):
        list(readers.read_hf("hf:org/set", cap=100))


@pytest.mark.unit
def test_default_corpus_missing_packages_names_install_command(tmp_path: Path) -> None:
    with pytest.raises(DataError) as err:
        corpus.open_source("default", root=tmp_path)
    assert corpus.INSTALL_COMMAND in str(err.value)
    assert "python3.11-doc" in str(err.value)


def fake_debian_root(root: Path) -> Path:
    """A miniature of the three packages' file layout."""
    para = make_text(60, 3)
    py = root / "usr/share/doc/python3.11/html/_sources/library"
    py.mkdir(parents=True)
    (py / "b.rst.txt").write_text(f"Bee\n===\n\n{para}\n\n{make_text(60, 9)}\n")
    (py / "a.rst.txt").write_text(f"Aye\n===\n\n{para}\n\n{make_text(60, 4)}\n")
    (py / "stub.rst.txt").write_text("Too short\n")
    pod = root / "usr/share/perl/5.36.0/pod"
    pod.mkdir(parents=True)
    (pod / "perlx.pod").write_text(f"=head1 NAME\n\n{make_text(80, 5)}\n\n=cut\n")
    (pod / "perltoc.pod").write_text(f"=head1 TOC\n\n{make_text(80, 6)}\n")
    linux = root / "usr/share/doc/linux-doc-6.1/Documentation"
    (linux / "translations").mkdir(parents=True)
    with gzip.open(linux / "intro.rst.gz", "wt") as f:
        f.write(f"Kernel\n------\n\n{make_text(80, 7)}\n")
    with gzip.open(linux / "translations" / "zh.rst.gz", "wt") as f:
        f.write(make_text(80, 8))
    return root


@pytest.mark.unit
def test_default_corpus_layout_order_dedupe_and_workers(tmp_path: Path) -> None:
    root = fake_debian_root(tmp_path)
    docs = list(corpus.iter_default_corpus(root))
    names = [d.name for d in docs]
    assert names == [
        "python3.11-doc:library/a.rst.txt",
        "python3.11-doc:library/b.rst.txt",
        "perl-doc:perlx.pod",
        "linux-doc-6.1:intro.rst.gz",
    ]  # sorted per package; stub, perltoc.pod and translations/ left out
    shared = make_text(60, 3).split("\n\n")[0]
    assert shared in docs[0].text and shared not in docs[1].text  # repeated paragraph dropped
    assert docs == list(corpus.iter_default_corpus(root, workers=2))


@pytest.mark.unit
def test_default_corpus_installed_extracts_prose() -> None:
    try:
        files = corpus.default_corpus_files()
    except DataError:
        pytest.skip("Debian documentation packages not installed: " + corpus.INSTALL_COMMAND)
    assert len(files) > 3000
    docs = list(corpus.cap_chars(corpus.iter_default_corpus(), 300_000))
    text = "\n".join(d.text for d in docs)
    assert len(text) >= 290_000
    assert not re.search(r"^\.\. |:\w+:`|::$|^\s*>>>", text, re.M), "markup left over"
    assert docs[0].name.startswith("python3.11-doc:")
