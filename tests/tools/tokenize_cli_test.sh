#!/usr/bin/env bash
# tests/tools/tokenize_cli_test.sh — `mpengine data tokenize` and `data decode`:
#   - three small documents (English, Chinese, Esperanto in ISO-8859-3: not UTF-8) tokenized with
#     a 4,002-id and a 72,012-id tokenizer give byte for byte the shards that
#     tools/bench/tokenize_cli_golden.py built from Hugging Face tokenizers' own ids: separators,
#     the val split, the train shards' sizes and names, uint16 and uint32 headers;
#   - the shards do not depend on --threads; JSON lines give what the same texts as files give;
#   - decode gives the documents back (byte-level BPE is lossless for UTF-8 text);
#   - existing shards are never replaced without --overwrite, and nothing is left behind by a
#     failure; each bad input exits 2 naming the file, the line or the JSON path.
set -uo pipefail
mpengine=${1:-${MPENGINE:-tools/mpengine}}
testdata=${2:-tests/tools/testdata/tokenize}
tokenizers=${3:-tests/engine/testdata/tokenizers}
tmp=${TEST_TMPDIR:-$(mktemp -d)}/tokenize_cli
rm -rf "$tmp" && mkdir -p "$tmp"
failures=0
source "$(dirname "${BASH_SOURCE[0]}")/cli_expect.sh" || { echo "cannot load cli_expect.sh"; exit 1; }

inputs=("$testdata/computers.txt" "$testdata/chinese.txt" "$testdata/proverbaro-latin3.txt")

same_shards() { # same_shards EXPECTED_PREFIX GOT_PREFIX WHAT
  local expected=("$1"_*.bin) got=("$2"_*.bin)
  if [ "${#expected[@]}" != "${#got[@]}" ]; then
    fail "$3: ${#got[@]} shards written, want ${#expected[@]}: ${got[*]##*/}"
    return
  fi
  for ((i = 0; i < ${#expected[@]}; ++i)); do
    if [ "${expected[i]##*_}" != "${got[i]##*_}" ] ||
      [ "${expected[i]#"$1"}" != "${got[i]#"$2"}" ]; then
      fail "$3: shard ${got[i]##*/} where ${expected[i]##*/} was expected"
    elif ! cmp -s "${expected[i]}" "${got[i]}"; then
      fail "$3: ${got[i]##*/} differs from Hugging Face's ids ($(cmp "${expected[i]}" "${got[i]}" 2>&1))"
    fi
  done
}

for name in gpt2_style big_vocab; do
  expect 0 "tokenized 3 documents" "(100 val)" \
    -- "$mpengine" data tokenize --tokenizer "$tokenizers/$name" --out "$tmp/$name" \
    --val-tokens 100 --shard-tokens 300 --threads 2 "${inputs[@]}"
  same_shards "$testdata/expected_$name" "$tmp/$name" "$name"
  expect 0 "tokenized 3 documents" \
    -- "$mpengine" data tokenize --tokenizer "$tokenizers/$name/tokenizer.json" \
    --out "$tmp/one_thread_$name" --val-tokens 100 --shard-tokens 300 --threads 1 "${inputs[@]}"
  same_shards "$testdata/expected_$name" "$tmp/one_thread_$name" "$name with --threads 1"
done
expect 0 "(uint32 ids, magic 20240801, version 7)" \
  -- "$mpengine" data inspect "$tmp/big_vocab_val_000000.bin" --vocab 72012

# A quoted glob is expanded in name order, as run --data expands it.
cp "${inputs[@]}" "$tmp/"
mkdir -p "$tmp/globbed" && cp "$testdata/computers.txt" "$tmp/globbed/a.txt" &&
  cp "$testdata/chinese.txt" "$tmp/globbed/b.txt"
expect 0 "tokenized 2 documents" \
  -- "$mpengine" data tokenize --tokenizer "$tokenizers/gpt2_style" --out "$tmp/glob" "$tmp/globbed/*.txt"
expect 0 "tokenized 2 documents" \
  -- "$mpengine" data tokenize --tokenizer "$tokenizers/gpt2_style" --out "$tmp/listed" \
  "$tmp/globbed/a.txt" "$tmp/globbed/b.txt"
cmp -s "$tmp/glob_train_000000.bin" "$tmp/listed_train_000000.bin" ||
  fail "a quoted glob gave other shards than its files listed in name order"

# JSON lines: the same two UTF-8 texts as one file of two lines give the same shard; standard
# input too.
python3 - "$tmp/globbed/a.txt" "$tmp/globbed/b.txt" > "$tmp/docs.jsonl" <<'PY'
import json, sys
for path in sys.argv[1:]:
    print(json.dumps({"id": path, "text": open(path, encoding="utf-8", errors="replace").read()}))
PY
# b.txt is cut mid-character, so its JSON line holds U+FFFD where the file holds the bad bytes:
# both read as U+FFFD.
expect 0 "tokenized 2 documents" \
  -- "$mpengine" data tokenize --tokenizer "$tokenizers/gpt2_style" --out "$tmp/jsonl" --jsonl "$tmp/docs.jsonl"
cmp -s "$tmp/jsonl_train_000000.bin" "$tmp/listed_train_000000.bin" ||
  fail "--jsonl gave other ids than the same texts as files"
expect 0 "tokenized 2 documents" \
  -- bash -c "'$mpengine' data tokenize --tokenizer '$tokenizers/gpt2_style' --out '$tmp/stdin' --jsonl - < '$tmp/docs.jsonl'"
cmp -s "$tmp/stdin_train_000000.bin" "$tmp/listed_train_000000.bin" ||
  fail "--jsonl - (standard input) gave other ids than the same texts as files"

# Decode gives the text back: the first document, after its separator.
"$mpengine" data decode --tokenizer "$tokenizers/gpt2_style" --skip-special \
  --tokens "$(( $(stat -c %s "$tmp/listed_train_000000.bin") ))" "$tmp/listed_train_000000.bin" \
  > "$tmp/decoded.txt" 2>&1 || fail "data decode failed: $(cat "$tmp/decoded.txt")"
head -c "$(stat -c %s "$tmp/globbed/a.txt")" "$tmp/decoded.txt" | cmp -s - "$tmp/globbed/a.txt" ||
  fail "data decode did not give the first document back"
expect 0 "<|endoftext|>A" \
  -- "$mpengine" data decode --tokenizer "$tokenizers/gpt2_style" --ids 4000,32

# The prefix's directories are made, as llm.c's scripts make their data directory.
expect 0 "wrote $tmp/made/for/it/p_train_000000.bin" \
  -- "$mpengine" data tokenize --tokenizer "$tokenizers/gpt2_style" --out "$tmp/made/for/it/p" "$tmp/globbed/a.txt"

# Nothing a user wrote is replaced; a failure leaves no shard of its own.
expect 2 "--out $tmp/gpt2_style: $tmp/gpt2_style_train_000001.bin exists (7 shards of that prefix)" "pass --overwrite" \
  -- "$mpengine" data tokenize --tokenizer "$tokenizers/gpt2_style" --out "$tmp/gpt2_style" "${inputs[@]}"
cmp -s "$testdata/expected_gpt2_style_val_000000.bin" "$tmp/gpt2_style_val_000000.bin" ||
  fail "a refused tokenize changed an existing shard"
# An overwrite that fails leaves the old shards whole (the new ones are staged beside them).
printf '{"text": "fine"}\n\n{"body": "no text"}\n' > "$tmp/bad.jsonl"
expect 2 "$tmp/bad.jsonl:3: \$.text: missing" \
  -- "$mpengine" data tokenize --tokenizer "$tokenizers/gpt2_style" --out "$tmp/gpt2_style" --overwrite --jsonl "$tmp/bad.jsonl"
cmp -s "$testdata/expected_gpt2_style_val_000000.bin" "$tmp/gpt2_style_val_000000.bin" ||
  fail "a failed --overwrite run lost an existing shard"
[ "$(ls "$tmp"/gpt2_style_*.bin | wc -l)" = 7 ] || fail "a failed --overwrite run changed the shard set: $(ls "$tmp"/gpt2_style_*.bin)"
ls -a "$tmp" | grep -q "^\.gpt2_style\.tokenize-" && fail "a failed --overwrite run left staged shards: $(ls -a "$tmp" | grep tokenize-)"
expect 0 "tokenized 3 documents" "wrote $tmp/gpt2_style_train_000000.bin" \
  -- "$mpengine" data tokenize --tokenizer "$tokenizers/gpt2_style" --out "$tmp/gpt2_style" --overwrite "${inputs[@]}"
ls -a "$tmp" | grep -q "^\.gpt2_style\.tokenize-" && fail "--overwrite left staged shards: $(ls -a "$tmp" | grep tokenize-)"
[ ! -e "$tmp/gpt2_style_val_000000.bin" ] || fail "--overwrite left the old val shard (this run wrote none)"
printf '{"text": "fine"}\n\n{"body": "no text"}\n' > "$tmp/bad.jsonl"
expect 2 "$tmp/bad.jsonl:3: \$.text: missing (choose the field with --field NAME)" \
  -- "$mpengine" data tokenize --tokenizer "$tokenizers/gpt2_style" --out "$tmp/bad" --jsonl "$tmp/bad.jsonl"
ls "$tmp"/bad_* >/dev/null 2>&1 && fail "a failed tokenize left shards behind: $(ls "$tmp"/bad_*)"
printf '{"text": "fine"}\nnot json\n' > "$tmp/bad2.jsonl"
expect 2 "$tmp/bad2.jsonl:2: not a JSON object" \
  -- "$mpengine" data tokenize --tokenizer "$tokenizers/gpt2_style" --out "$tmp/bad" --jsonl "$tmp/bad2.jsonl"
printf '{"text": 3}\n' > "$tmp/bad3.jsonl"
expect 2 "$tmp/bad3.jsonl:1: \$.text: expected a string" \
  -- "$mpengine" data tokenize --tokenizer "$tokenizers/gpt2_style" --out "$tmp/bad" --jsonl "$tmp/bad3.jsonl"
expect 2 "$tmp/nothing.txt: no such file" \
  -- "$mpengine" data tokenize --tokenizer "$tokenizers/gpt2_style" --out "$tmp/bad" "$tmp/nothing.txt"
expect 2 "$tmp/globbed: is a directory" \
  -- "$mpengine" data tokenize --tokenizer "$tokenizers/gpt2_style" --out "$tmp/bad" "$tmp/globbed"
printf '{"version": "1.0", "model": {"type": "WordPiece", "vocab": {"a": 0}}}\n' > "$tmp/wordpiece.json"
expect 2 "$tmp/wordpiece.json" "\$.model.type" "WordPiece" \
  -- "$mpengine" data tokenize --tokenizer "$tmp/wordpiece.json" --out "$tmp/bad" "${inputs[@]}"
cat > "$tmp/template.json" <<'JSON'
{"version": "1.0", "truncation": null, "padding": null, "added_tokens": [], "normalizer": null,
 "pre_tokenizer": null, "decoder": null, "model": {"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": []},
 "post_processor": {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
   {"Sequence": {"id": "A", "type_id": 0}}], "pair": [],
   "special_tokens": {"<s>": {"id": "<s>", "ids": [7], "tokens": ["<s>"]}}}}
JSON
expect 2 "$tmp/template.json: \$.post_processor: the template's special token id 7 is no token of the vocabulary" \
  -- "$mpengine" data tokenize --tokenizer "$tmp/template.json" --out "$tmp/bad" "${inputs[@]}"
expect 2 "--separator <nope>:" "has no such token" \
  -- "$mpengine" data tokenize --tokenizer "$tokenizers/gpt2_style" --separator "<nope>" --out "$tmp/bad" "${inputs[@]}"
expect 2 "--field: only with --jsonl" \
  -- "$mpengine" data tokenize --tokenizer "$tokenizers/gpt2_style" --field body --out "$tmp/bad" "${inputs[@]}"
expect 2 "missing option --tokenizer" -- "$mpengine" data tokenize --out "$tmp/bad" "${inputs[@]}"
expect 2 "--ids: '4000,x' is not a comma-separated list of ids" \
  -- "$mpengine" data decode --tokenizer "$tokenizers/gpt2_style" --ids 4000,x
expect 2 "give either a SHARD or --ids" -- "$mpengine" data decode --tokenizer "$tokenizers/gpt2_style"
# A shard with ids of a bigger vocabulary than the tokenizer's.
expect 2 "$tmp/big_vocab_train_000001.bin" "outside the vocabulary" \
  -- "$mpengine" data decode --tokenizer "$tokenizers/gpt2_style" "$tmp/big_vocab_train_000001.bin"

if [ "$failures" -gt 0 ]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "all tokenize checks passed"
