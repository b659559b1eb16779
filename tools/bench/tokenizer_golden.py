#!/usr/bin/env python3
"""tools/bench/tokenizer_golden.py — the Hugging Face `tokenizers` goldens that mpengine's C
tokenizer (engine/data/tokenizer/) is held to (issue 31): the ids of
`Tokenizer.from_file(path).encode(text).ids`, exactly, for tokenizer.json files shaped like the
families mpengine trains.

Writes under tests/engine/testdata/tokenizers/:
  corpus.txt               the corpus files with their byte size and FNV-1a 64 of their bytes, so
                           a test can tell a changed Debian package from a tokenizer bug
  NAME/tokenizer.json      a BPE tokenizer trained here with `tokenizers` on the corpus's train
                           documents, configured as the real family's file is (see FAMILIES)
  NAME/golden.txt          one line per test document:
                             PATH OFFSET LENGTH COUNT HASH
                           PATH relative to /usr/share/games/fortunes, OFFSET and LENGTH in bytes
                           of the original file, COUNT = len(ids), HASH = FNV-1a 64 (basis
                           0xcbf29ce484222325, prime 0x100000001b3) over the ids as little-endian
                           uint32, 16 lowercase hex digits; ids = encode(text).ids with the default
                           add_special_tokens=True, text = bytes.decode("utf-8", "replace")
  NAME/samples.jsonl       ~60 tricky strings, each: text_hex (the raw bytes), text (lossy, for
                           people), ids / ids_no_special (add_special_tokens True / False),
                           decoded / decoded_hex (decode(ids, skip_special_tokens=False)),
                           decoded_skip_special / decoded_skip_special_hex (True), and
                           decoded_prefix_hex (decode of the first half of ids_no_special, which
                           may cut a character: the lossy decode path)

Corpus (fixed, see CORPUS_FILES): fortune files of the Debian packages fortunes, fortunes-min,
fortunes-zh, -cs, -de, -es, -it, -pl, -ru and fortunes-eo-iso3 (ISO-8859-3, not UTF-8). A
document is the bytes between separator lines: a line whose content is exactly "%" (or "%\r" in
the two CRLF files), the line's "\n" belonging to the separator. Documents of zero bytes are
dropped; the remaining ones are numbered from 0 per file; index % 4 == 0 is train, the rest test.

Usage:
  /work/venv-golden/bin/python tools/bench/tokenizer_golden.py            train, then goldens
  /work/venv-golden/bin/python tools/bench/tokenizer_golden.py --goldens  goldens from the
                                                                          committed tokenizer.json
  ... --only NAME[,NAME]                                                 a subset
"""

import argparse
import json
import os
import sys

import tokenizers
from tokenizers import (AddedToken, Regex, Tokenizer, decoders, models, normalizers,
                        pre_tokenizers, processors, trainers)

FORTUNES = "/usr/share/games/fortunes"
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT_DIR = os.path.join(REPO, "tests", "engine", "testdata", "tokenizers")

# 284 files, 7,001,792 bytes, 34,528 documents (25,791 test): the fortune files of the packages
# tools/setup.sh installs (fortunes, fortunes-min, -zh, -cs, -de, -es, -it, -pl, -ru) plus
# fortunes-eo-iso3 — every regular file at the top level (English, plus chinese, tang300 and
# song100 of fortunes-zh), cs/, de/ (but zitate), es/, it/ (but italia), the pl/ files under
# 100 KB, the ru/ files under 40 KB, eo-iso3/proverbaro (ISO-8859-3: the one file that is not
# UTF-8) — less these, the files with most documents, dropped to keep the goldens (one line per
# document) small:
#   es/refranes.fortunes cs/klasik-cz people definitions de/unfug cookie de/witze cs/market it/norm
#   es/sabiduria.fortunes songs-poems politics cs/zemeplocha miscellaneous work science de/linuxtag
#   it/luke it/paolotedeschi men-women es/varios.fortunes es/sentimientos.fortunes zippy knghtbrd
#   es/off/camioneros.fortunes platitudes de/infodrom it/leggi it/computer wisdom de/namen
#   pl/chuck-norris cs/citace es/arte.fortunes es/humanos.fortunes es/vida.fortunes
CORPUS_FILES = [
    'art', 'ascii-art', 'chinese', 'computers', 'cs/chesterton', 'cs/cimrman', 'cs/citat',
    'cs/filmy', 'cs/guth', 'cs/hornicek', 'cs/ignac', 'cs/jerome', 'cs/josef', 'cs/klasik-sk',
    'cs/lkml', 'cs/lodge', 'cs/mikulas', 'cs/mladik', 'cs/murphy', 'cs/parafraze', 'cs/parkinson',
    'cs/plihal', 'cs/pocitace', 'cs/pratchett', 'cs/prislovi', 'cs/rdvcitaty', 'cs/skala',
    'cs/stoa1', 'cs/stopar', 'cs/valka', 'cs/vodnansky', 'cs/wikiquote', 'cs/wodehouse',
    'cs/wright', 'de/anekdoten', 'de/asciiart', 'de/bahnhof', 'de/beilagen', 'de/brot',
    'de/channel-debian.fortunes', 'de/computer', 'de/debian', 'de/dessert', 'de/doppelsinnig',
    'de/elefanten', 'de/fussball', 'de/gedichte', 'de/hauptgericht', 'de/holenlassen', 'de/huhn',
    'de/kalt', 'de/kinderzitate', 'de/kuchen', 'de/letzteworte', 'de/lieberals', 'de/loewe',
    'de/mathematiker', 'de/ms', 'de/murphy', 'de/plaetzchen', 'de/quiz', 'de/regeln', 'de/salat',
    'de/sauce', 'de/sicherheitshinweise', 'de/sprichworte', 'de/sprichwortev', 'de/sprueche',
    'de/stilblueten', 'de/suppe', 'de/tips', 'de/translations', 'de/vornamen', 'de/vorspeise',
    'de/warmduscher', 'de/woerterbuch', 'de/wusstensie', 'debian', 'disclaimer', 'drugs',
    'education', 'eo-iso3/proverbaro', 'es/amistad.fortunes', 'es/asimov.fortunes',
    'es/ciencia.fortunes', 'es/deprimente.fortunes', 'es/familia.fortunes', 'es/famosos.fortunes',
    'es/filosofia.fortunes', 'es/informatica.fortunes', 'es/lao-tse.fortunes',
    'es/leydemurphy.fortunes', 'es/libertad.fortunes', 'es/nietzsche.fortunes',
    'es/off/hembrismo.fortunes', 'es/off/homosexuales.fortunes', 'es/off/machosno.fortunes',
    'es/off/misogino.fortunes', 'es/off/proverbios.fortunes', 'es/off/racistas.fortunes',
    'es/off/varios.fortunes', 'es/pintadas.fortunes', 'es/poder.fortunes',
    'es/proverbios.fortunes', 'es/schopenhauer.fortunes', 'es/varios.fortunes-pre',
    'es/verdad.fortunes', 'ethnic', 'food', 'fortunes', 'goedel', 'humorists', 'it/adams',
    'it/banner', 'it/definizioni', 'it/formiche', 'it/itatrek', 'it/jackfr', 'it/luttazzi',
    'it/zuse', 'kids', 'law', 'linux', 'linuxcookie', 'literature', 'love', 'magic', 'medicine',
    'news', 'paradoxum', 'perl', 'pets', 'pl/7thguard', 'pl/adamg', 'pl/advocacy', 'pl/apcoh',
    'pl/bajki', 'pl/baseciq', 'pl/blug', 'pl/bok', 'pl/cnp', 'pl/cows', 'pl/djurban',
    'pl/dookola-pld', 'pl/dowcipy-feministyczne', 'pl/dowcipy-lepper', 'pl/dowcipy-naukowcy',
    'pl/dowcipy-niskopoziomowe', 'pl/dowcipy-szowinistyczne', 'pl/dwimc', 'pl/dzieci', 'pl/gentoo',
    'pl/gra_polslowek', 'pl/haiku', 'pl/http', 'pl/icpusers', 'pl/imiona', 'pl/ipv6.pl', 'pl/irc',
    'pl/jogger_pl', 'pl/kloczkish', 'pl/komputery', 'pl/konikbujany', 'pl/koscielne', 'pl/lcamtuf',
    'pl/linux', 'pl/linuxfr', 'pl/matrymonialne', 'pl/matura', 'pl/microsoft', 'pl/milosc',
    'pl/misc', 'pl/mmazur', 'pl/nauka', 'pl/newyear', 'pl/nowe', 'pl/ospl', 'pl/ospl-ad',
    'pl/pLug', 'pl/pLug-slc2001', 'pl/pamietnik_policjanta', 'pl/pcol', 'pl/perl',
    'pl/pingwinaria', 'pl/pld-fork', 'pl/pldhelp', 'pl/plug', 'pl/polish_manpages', 'pl/pplug',
    'pl/pratchett', 'pl/psy1', 'pl/puchatek', 'pl/radio_maryja', 'pl/rywingate', 'pl/rzewski',
    'pl/sad', 'pl/sapkowski', 'pl/seneka', 'pl/sigpl', 'pl/sigvirus', 'pl/slogany', 'pl/slownik',
    'pl/spolem', 'pl/sport', 'pl/stachura', 'pl/stirlitz', 'pl/teleturnieje', 'pl/wierszyki',
    'pl/wieza-pilot', 'pl/x-avalon', 'pl/zen', 'pl/znaki_zodiaku', 'pratchett', 'riddles',
    'ru/2001.03', 'ru/2001.04', 'ru/2001.05', 'ru/2001.06', 'ru/2001.07', 'ru/2001.08',
    'ru/2001.09', 'ru/2001.10', 'ru/2001.11', 'ru/2001.12', 'ru/2002.01', 'ru/2002.02',
    'ru/2002.03', 'ru/2002.04', 'ru/2002.05', 'ru/2002.06', 'ru/2002.07', 'ru/2002.08',
    'ru/2002.09', 'ru/2002.10', 'ru/2002.11', 'ru/2002.12', 'ru/2003.01', 'ru/2003.02',
    'ru/2003.03', 'ru/2003.04', 'ru/2003.05', 'ru/2003.06', 'ru/2003.07', 'ru/2006.03', 'ru/M$',
    'ru/adv', 'ru/adv_v', 'ru/amur', 'ru/b11', 'ru/b12', 'ru/b13', 'ru/citates', 'ru/conscience',
    'ru/d1', 'ru/d21', 'ru/d41', 'ru/do_you_know', 'ru/drink', 'ru/e0', 'ru/e12', 'ru/ego_and_alt',
    'ru/feano', 'ru/genious', 'ru/haiku', 'ru/human_being', 'ru/if', 'ru/ill', 'ru/innocence',
    'ru/just4fun', 'ru/life_k', 'ru/lovers', 'ru/man_and_woman', 'ru/other', 'ru/polyakov',
    'ru/programming', 'ru/religion', 'ru/russia_today', 'ru/truth_and_lie', 'song100', 'sports',
    'startrek', 'tang300', 'tao', 'translate-me',
]

FNV_BASIS = 0xcbf29ce484222325
FNV_PRIME = 0x100000001b3
MASK64 = (1 << 64) - 1


def fnv1a64(data):
    h = FNV_BASIS
    for b in data:
        h = ((h ^ b) * FNV_PRIME) & MASK64
    return h


def ids_hash(ids):
    return "%016x" % fnv1a64(b"".join(i.to_bytes(4, "little") for i in ids))


def split_documents(data):
    """(offset, length) of each non-empty document of a fortune file's bytes."""
    docs = []
    start = 0
    pos = 0
    n = len(data)
    while pos < n:
        end = data.find(b"\n", pos)
        line_end = n if end < 0 else end + 1
        content = data[pos:line_end].rstrip(b"\n")
        if content == b"%" or content == b"%\r":
            if pos > start:
                docs.append((start, pos - start))
            start = line_end
        pos = line_end
    if n > start:
        docs.append((start, n - start))
    return docs


def load_corpus():
    """[(path, file_bytes, [(offset, length, is_train)])] for CORPUS_FILES, in order."""
    corpus = []
    for rel in CORPUS_FILES:
        full = os.path.join(FORTUNES, rel)
        try:
            with open(full, "rb") as f:
                data = f.read()
        except OSError as e:
            sys.exit("tokenizer_golden: cannot read %s (%s): install the Debian fortunes packages "
                     "(tools/setup.sh) and fortunes-eo-iso3" % (full, e))
        docs = [(off, ln, i % 4 == 0) for i, (off, ln) in enumerate(split_documents(data))]
        corpus.append((rel, data, docs))
    return corpus


def doc_text(data, off, ln):
    return data[off:off + ln].decode("utf-8", "replace")


# ---------------------------------------------------------------------------------------------
# The families. Each builder trains on `texts` and returns a Tokenizer; its JSON is then patched
# to the real file's exact field values (the Python constructors do not expose all of them).

LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                  r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
                 r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
SPM_BYTES = ["<0x%02X>" % b for b in range(256)]


def byte_level_trainer(vocab_size):
    return trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False,
                               initial_alphabet=pre_tokenizers.ByteLevel.alphabet())


def build_gpt2(texts, vocab_size=4000):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.train_from_iterator(texts, byte_level_trainer(vocab_size))
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.add_special_tokens([AddedToken("<|endoftext|>", special=True, normalized=False)])
    # RoBERTa's <mask>: lstrip, so " <mask>" takes the space with it.
    tok.add_special_tokens([AddedToken("<mask>", lstrip=True, special=True, normalized=False)])
    return tok


def patch_gpt2(j):
    j["model"].update(dropout=None, unk_token=None, continuing_subword_prefix="",
                      end_of_word_suffix="", fuse_unk=False, byte_fallback=False,
                      ignore_merges=False)
    j["pre_tokenizer"] = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                          "use_regex": True}
    j["post_processor"] = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False,
                           "use_regex": True}
    j["decoder"] = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                    "use_regex": True}
    merges_as_strings(j)  # GPT-2's file has "a b" merges


LLAMA3_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
                   "<|reserved_special_token_1|>", "<|reserved_special_token_2|>",
                   "<|reserved_special_token_3|>", "<|start_header_id|>", "<|end_header_id|>",
                   "<|reserved_special_token_4|>", "<|eot_id|>", "<|reserved_special_token_5|>",
                   "<|reserved_special_token_6|>"]


def build_llama3(texts, vocab_size=8000):
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
    tok.train_from_iterator(texts, byte_level_trainer(vocab_size - UNMERGED_WORDS))
    tok = add_unmerged_words(tok, texts, UNMERGED_WORDS)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t in LLAMA3_SPECIALS])
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(
            single="<|begin_of_text|> $A:0",
            pair="<|begin_of_text|>:0 $A:0 <|begin_of_text|>:1 $B:1",
            special_tokens=[("<|begin_of_text|>", bos)])])
    return tok


UNMERGED_WORDS = 64


def add_unmerged_words(tok, texts, count):
    """Appends to the vocabulary the `count` most frequent pre-tokenized words that are not in
    it, with no merge that makes them: only ignore_merges (the word looked up whole before any
    merge) gives their id, as in Llama 3's file, whose vocabulary holds words its merges do not
    reach in rank order. A trained vocabulary alone never shows the difference."""
    vocab = tok.get_vocab()
    freq = {}
    for t in texts:
        for piece, _ in tok.pre_tokenizer.pre_tokenize_str(t):
            if piece not in vocab and len(piece) > 1:
                freq[piece] = freq.get(piece, 0) + 1
    words = sorted(freq, key=lambda w: (-freq[w], w))[:count]
    j = json.loads(tok.to_str())
    for w in words:
        j["model"]["vocab"][w] = len(j["model"]["vocab"])
    return Tokenizer.from_str(json.dumps(j))


def patch_llama3(j):
    j["model"].update(dropout=None, unk_token=None, continuing_subword_prefix=None,
                      end_of_word_suffix=None, fuse_unk=False, byte_fallback=False,
                      ignore_merges=True)
    j["pre_tokenizer"]["pretokenizers"][1] = {"type": "ByteLevel", "add_prefix_space": False,
                                              "trim_offsets": True, "use_regex": False}
    j["post_processor"]["processors"][0] = {"type": "ByteLevel", "add_prefix_space": True,
                                            "trim_offsets": False, "use_regex": True}
    j["decoder"] = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                    "use_regex": True}
    merges_as_strings(j)  # Llama 3's file has "a b" merges


def build_qwen2(texts, vocab_size=6000):
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)])
    tok.train_from_iterator(texts, byte_level_trainer(vocab_size))
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>")])
    # Qwen2.5's tool-call markers are added tokens that are not special (decode keeps them);
    # "naïve" is matched on NFC-normalized text (normalized=True), so "nai\u0308ve" finds it too.
    tok.add_tokens([AddedToken("<tool_call>", special=False, normalized=False),
                    AddedToken("</tool_call>", special=False, normalized=False),
                    AddedToken("na\u00efve", special=False, normalized=True)])
    return tok


def patch_qwen2(j):
    j["model"].update(dropout=None, unk_token=None, continuing_subword_prefix="",
                      end_of_word_suffix="", fuse_unk=False, byte_fallback=False,
                      ignore_merges=False)
    j["normalizer"] = {"type": "NFC"}
    j["pre_tokenizer"]["pretokenizers"][1] = {"type": "ByteLevel", "add_prefix_space": False,
                                              "trim_offsets": False, "use_regex": False}
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                  "use_regex": False}
    j["post_processor"] = dict(byte_level)
    j["decoder"] = dict(byte_level)
    # merges stay as [a, b] pairs: the newer form (tokenizers >= 0.20), which C must read too


def spm_train(texts, vocab_size, specials, limit_alphabet):
    """A SentencePiece-like BPE: words are "▁"-prefixed whitespace-separated pieces while
    training (Metaspace split), so no merge crosses a word boundary; `specials` and the 256
    <0xNN> byte tokens come first in the vocabulary; the alphabet is limited so rare characters
    go to byte fallback."""
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always",
                                                 split=True)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False,
                                  special_tokens=specials + SPM_BYTES,
                                  limit_alphabet=limit_alphabet)
    tok.train_from_iterator(texts, trainer)
    return tok


def build_llama2(texts, vocab_size=4000):
    tok = spm_train(texts, vocab_size, ["<unk>", "<s>", "</s>"], limit_alphabet=200)
    tok.pre_tokenizer = None
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"),
                                           normalizers.Replace(" ", "\u2581")])
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                     decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A:0", pair="<s>:0 $A:0 <s>:1 $B:1",
        special_tokens=[("<s>", tok.token_to_id("<s>"))])
    return tok


def patch_spm(j, specials):
    """Byte tokens are vocabulary entries, not added tokens (as in Llama 2's file); the added
    tokens are the specials, special and not normalized."""
    j["added_tokens"] = [t for t in j["added_tokens"] if t["content"] in specials]
    for t in j["added_tokens"]:
        t.update(single_word=False, lstrip=False, rstrip=False, normalized=False, special=True)
    j["model"].update(dropout=None, unk_token="<unk>", continuing_subword_prefix=None,
                      end_of_word_suffix=None, fuse_unk=True, byte_fallback=True,
                      ignore_merges=False)


def patch_llama2(j):
    patch_spm(j, {"<unk>", "<s>", "</s>"})
    j["normalizer"] = {"type": "Sequence", "normalizers": [
        {"type": "Prepend", "prepend": "\u2581"},
        {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]}
    j["pre_tokenizer"] = None
    j["decoder"] = {"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
        {"type": "ByteFallback"}, {"type": "Fuse"},
        {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}
    merges_as_strings(j)  # Llama 2's file has "a b" merges


MISTRAL_SPECIALS = ["<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[TOOL_CALLS]",
                    "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]",
                    "[/TOOL_RESULTS]"]


def build_mistral(texts, vocab_size=4000):
    # Mistral v0.3's layout: control tokens after </s>, so <0x00> is id 10, not 3.
    tok = spm_train(texts, vocab_size, MISTRAL_SPECIALS, limit_alphabet=1000)
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first",
                                                 split=False)
    tok.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="first", split=False)
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A:0", pair="<s>:0 $A:0 <s>:1 $B:1",
        special_tokens=[("<s>", tok.token_to_id("<s>"))])
    return tok


def patch_mistral(j):
    patch_spm(j, set(MISTRAL_SPECIALS))
    j["normalizer"] = None
    meta = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first",
            "split": False}
    j["pre_tokenizer"] = dict(meta)
    j["decoder"] = dict(meta)


def build_big(texts, vocab_size=72000):
    return build_llama3(texts, vocab_size)


def merges_as_strings(j):
    merges = j["model"]["merges"]
    if merges and isinstance(merges[0], list):
        assert all(" " not in a and " " not in b for a, b in merges)
        j["model"]["merges"] = ["%s %s" % (a, b) for a, b in merges]


# name: (builder, patch, train on all documents?)
FAMILIES = {
    "gpt2_style": (build_gpt2, patch_gpt2, False),
    "llama3_style": (build_llama3, patch_llama3, False),
    "qwen2_style": (build_qwen2, patch_qwen2, False),
    "llama2_style": (build_llama2, patch_llama2, False),
    "mistral_style": (build_mistral, patch_mistral, False),
    "big_vocab": (build_big, patch_llama3, True),
}

# ---------------------------------------------------------------------------------------------
# Samples: strings whose handling differs between families or is easy to get wrong.

SAMPLES = [
    b"", b" ", b"  ", b"   ", b"\n", b"\n\n\n", b"\t", b"\t\tindented\n", b" \n \n  \n",
    b" leading space", b"trailing space ", b"  two leading and two trailing  ",
    b"Hello world", b"hello  world   with    runs", b"line one\nline two\r\nline three\r\n",
    b"Ends with newline\n", b"1234567", b"3.14159 and 1,000,000 and 2024-01-01 and 12345678901",
    b"I'm don't WE'LL they've SHE'D it's O'Neil's", b"'s 's 'S", b"x = a+b; // comment\n",
    "emoji 😀👍🏽 family 👨‍👩‍👧 flag 🇵🇱".encode(), "中文测试：你好，世界！".encode(),
    "日本語のテキスト、カタカナ".encode(), "한국어 텍스트".encode(),
    "Ελληνικά γράμματα".encode(), "Привет, мир! Ёжик в тумане".encode(),
    "Zażółć gęślą jaźń".encode(), "Příliš žluťoučký kůň úpěl ďábelské ódy".encode(),
    "Grüße aus Köln, Straße".encode(), "¿Qué tal? ¡Olé!".encode(),
    "cafe\u0301 vs caf\u00e9".encode(), "nai\u0308ve and na\u00efve".encode(),
    "\u212b (angstrom sign) vs \u00c5".encode(), "ﬁ ligature ① ＡＢＣ fullwidth".encode(),
    "a\u0300\u0301\u0302 stacked".encode(), "\u1100\u1161\u11a8 jamo".encode(),
    b"hello<|endoftext|>world", b"<|endoftext|>", b"<|endoftext|><|endoftext|>",
    b" <|endoftext|> ", b"<s>hello</s>", b"hello <s> world", b"hello<s>world",
    b"<|begin_of_text|>hi<|end_of_text|>",
    b"<|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>",
    b"<|im_start|>user\nhi<|im_end|>\n", b"x<|im_end|>y", b"<|endoftext", b"<|endoftext|",
    b"[INST] hi [/INST]", b"[INST]hi[/INST]", b" [INST]",
    b"text <mask> more", b"a<mask>b", b"a   <mask>", b"a \t\n <mask> b", b"<mask>",
    b"<tool_call>{\"a\": 1}</tool_call>", b" <tool_call> ",
    b"The American ISO again -devel", b"\tHow commandname",
    "bad \ufffd char \ufffd\ufffd".encode(),
    b"\xff", b"abc\xe4\xb8", b"\xc3\x28", b"\xed\xa0\x80 surrogate", b"\xf0\x9f\x98 cut emoji",
    b"\xe9t\xe9 latin-1", b"\x80\x80\x80", b"ok\xf8\x88\x80\x80\x80five", b"\xc0\xaf overlong",
    b"a" * 300, b"Pneumonoultramicroscopicsilicovolcanoconiosis" * 8,
    "汉".encode() * 200, b"\x1b[33mcolored\x1b[m", b"\x00nul\x01", b"\x7f del",
    "\u00a0nbsp\u2009thin\u3000ideographic \u2028 sep".encode(), "\u200bzero\u200dwidth".encode(),
    "\u2581already metaspace \u2581\u2581 ▁x".encode(), b"<0x41> literal <unk>",
    "ĠĊ byte-level lookalikes".encode(),
]


def sample_entry(tok, raw):
    text = raw.decode("utf-8", "replace")
    ids = tok.encode(text).ids
    ids_ns = tok.encode(text, add_special_tokens=False).ids
    dec = tok.decode(ids, skip_special_tokens=False)
    dec_skip = tok.decode(ids, skip_special_tokens=True)
    dec_prefix = tok.decode(ids_ns[:len(ids_ns) // 2], skip_special_tokens=False)
    return {"text_hex": raw.hex(), "text": text, "ids": ids, "ids_no_special": ids_ns,
            "decoded": dec, "decoded_hex": dec.encode("utf-8").hex(),
            "decoded_skip_special": dec_skip,
            "decoded_skip_special_hex": dec_skip.encode("utf-8").hex(),
            "decoded_prefix_hex": dec_prefix.encode("utf-8").hex()}


# ---------------------------------------------------------------------------------------------

def train(name, corpus):
    build, patch, all_docs = FAMILIES[name]
    texts = [doc_text(data, off, ln) for _, data, docs in corpus
             for off, ln, is_train in docs if is_train or all_docs]
    tok = build(texts)
    j = json.loads(tok.to_str())
    patch(j)
    os.makedirs(os.path.join(OUT_DIR, name), exist_ok=True)
    path = os.path.join(OUT_DIR, name, "tokenizer.json")
    with open(path, "w", encoding="utf-8") as f:
        # pretty-printed as the real files are; the big one on one line, to stay small
        json.dump(j, f, ensure_ascii=False, indent=None if all_docs else 2)
        f.write("\n")
    print("%s: trained on %d documents, vocab %d" %
          (name, len(texts), Tokenizer.from_file(path).get_vocab_size(with_added_tokens=True)))


def goldens(name, corpus):
    path = os.path.join(OUT_DIR, name, "tokenizer.json")
    tok = Tokenizer.from_file(path)
    all_docs = FAMILIES[name][2]
    vocab = tok.get_vocab_size(with_added_tokens=True)
    lines = ["# tokenizers %s: Tokenizer.from_file(\"tokenizer.json\").encode(text).ids, "
             "add_special_tokens=True; vocab %d (with added tokens)" % (tokenizers.__version__,
                                                                       vocab),
             "# test documents (index %% 4 != 0) of tests/engine/testdata/tokenizers/corpus.txt; "
             "text = bytes.decode(\"utf-8\", \"replace\"); trained on %s; "
             "PATH OFFSET LENGTH COUNT FNV1A64(ids as uint32 LE)" %
             ("all documents" if all_docs else "the train documents (index % 4 == 0)")]
    total_docs = total_tokens = above16 = 0
    above16_nonspecial = 0
    for rel, data, docs in corpus:
        test = [(off, ln) for off, ln, is_train in docs if not is_train]
        encs = tok.encode_batch([doc_text(data, off, ln) for off, ln in test])
        for (off, ln), enc in zip(test, encs):
            ids = enc.ids
            lines.append("%s %d %d %d %s" % (rel, off, ln, len(ids), ids_hash(ids)))
            total_docs += 1
            total_tokens += len(ids)
            big = [i for i in ids if i > 65535]
            above16 += len(big)
            above16_nonspecial += sum(1 for i in big if i < tok.get_vocab_size(False))
    # encode_batch must equal encode: checked on a spread of documents
    rel, data, docs = corpus[0]
    for off, ln, is_train in docs[1::37]:
        t = doc_text(data, off, ln)
        assert tok.encode(t).ids == tok.encode_batch([t])[0].ids
    lines.append("# total documents %d tokens %d" % (total_docs, total_tokens))
    with open(os.path.join(OUT_DIR, name, "golden.txt"), "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    with open(os.path.join(OUT_DIR, name, "samples.jsonl"), "w", encoding="utf-8") as f:
        for raw in SAMPLES:
            f.write(json.dumps(sample_entry(tok, raw), ensure_ascii=False) + "\n")
    model_vocab = tok.get_vocab_size(with_added_tokens=False)
    print("%s: vocab %d (model %d, added %d), %d test documents, %d tokens, %d ids > 65535 "
          "(%d of them model tokens)" % (name, vocab, model_vocab, vocab - model_vocab,
                                         total_docs, total_tokens, above16, above16_nonspecial))
    return total_docs, total_tokens, vocab


def write_corpus_txt(corpus):
    lines = ["# tools/bench/tokenizer_golden.py's corpus: PATH (under /usr/share/games/fortunes) "
             "BYTES FNV1A64(bytes) DOCUMENTS TRAIN_DOCUMENTS",
             "# a document: the bytes between lines that are exactly \"%\" or \"%\\r\" (the "
             "separator line's \"\\n\" is the separator's), empty ones dropped; index % 4 == 0 is "
             "train"]
    total = 0
    for rel, data, docs in corpus:
        lines.append("%s %d %016x %d %d" % (rel, len(data), fnv1a64(data), len(docs),
                                            sum(1 for d in docs if d[2])))
        total += len(data)
    lines.append("# total files %d bytes %d documents %d" %
                 (len(corpus), total, sum(len(d) for _, _, d in corpus)))
    with open(os.path.join(OUT_DIR, "corpus.txt"), "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--goldens", action="store_true",
                    help="only recompute goldens from the committed tokenizer.json files")
    ap.add_argument("--only", default="", help="comma-separated subset of " + ",".join(FAMILIES))
    args = ap.parse_args()
    names = [n for n in args.only.split(",") if n] or list(FAMILIES)
    for n in names:
        if n not in FAMILIES:
            sys.exit("tokenizer_golden: unknown tokenizer %r" % n)
    corpus = load_corpus()
    os.makedirs(OUT_DIR, exist_ok=True)
    write_corpus_txt(corpus)
    for n in names:
        if not args.goldens:
            train(n, corpus)
        goldens(n, corpus)


if __name__ == "__main__":
    main()
