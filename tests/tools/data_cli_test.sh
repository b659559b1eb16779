#!/usr/bin/env bash
# tests/tools/data_cli_test.sh — `mpengine data synth` and `mpengine data inspect` as a user meets
# them: the line synth prints (with the entropy floor), the same bytes for the same seed, shards
# that inspect accepts, and exit 2 with the file named for each mistake.
set -uo pipefail
mpengine=${1:-${MPENGINE:-tools/mpengine}}
tmp=${TEST_TMPDIR:-$(mktemp -d)}/data_cli
mkdir -p "$tmp"
failures=0
source "$(dirname "${BASH_SOURCE[0]}")/cli_expect.sh" || { echo "cannot load cli_expect.sh"; exit 1; }

# Each command starts the whole binary (about 0.1 s), so every run checks all it can.

# synth: the line, and the floor for the documented defaults (a change to the source's RNG or its
# construction shows here).
expect 0 "wrote $tmp/a.bin: 5000 tokens, vocab 64, seed 7; entropy rate " \
  "nats/token (the lowest loss any model can reach)" \
  "source: 4 successors per token; a model that ignores context stays at " -- \
  $mpengine data synth --out "$tmp/a.bin" --vocab 64 --tokens 5000 --seed 7
$mpengine data synth --out "$tmp/b.bin" --vocab 64 --tokens 5000 --seed 7 >/dev/null
$mpengine data synth --out "$tmp/c.bin" --vocab 64 --tokens 5000 --seed 8 >/dev/null
expect 0 "wrote $tmp/default.bin: 1000000 tokens, vocab 256, seed 1337; entropy rate 1.0910 nats/token" -- \
  $mpengine data synth --out "$tmp/default.bin" --vocab 256
[ "$(stat -c %s "$tmp/a.bin")" = 11024 ] || fail "a.bin is not 1024 + 2 x 5000 bytes"
cmp -s "$tmp/a.bin" "$tmp/b.bin" || fail "the same seed wrote different files"
cmp -s "$tmp/a.bin" "$tmp/c.bin" && fail "different seeds wrote the same file"
ls "$tmp" | grep -q '\.tmp' && fail "a temporary file was left behind: $(ls "$tmp")"

# inspect accepts what synth writes, file by file and through a quoted glob.
expect 0 "$tmp/a.bin: 5000 tokens, 64 distinct ids, largest id 63; valid llm.c token shard (uint16 ids, magic 20240520, version 1)" \
  "$tmp/b.bin: 5000 tokens" "$tmp/c.bin: 5000 tokens" "total: 15000 tokens in 3 shards" -- \
  $mpengine data inspect "$tmp/[abc].bin" --vocab 64

# Bad shards: exit 2, the file named, what is wrong.
head -c 2000 "$tmp/a.bin" > "$tmp/truncated.bin"
expect 2 "$tmp/truncated.bin: the header says 5000 tokens, which take 1024 + 2 x 5000 = 11024 bytes, but the file is 2000 bytes (9024 short); the shard is truncated" -- \
  $mpengine data inspect "$tmp/truncated.bin"
head -c 1100 /dev/zero > "$tmp/zeros.bin"
expect 2 "$tmp/zeros.bin: bad magic number 0 in the header (expected 20240520 for uint16 ids or 20240801 for uint32 ids): not an llm.c token shard" -- \
  $mpengine data inspect "$tmp/zeros.bin"
expect 2 "$tmp/a.bin: token id " "is outside the vocabulary of 10 ids (0 .. 9)" -- \
  $mpengine data inspect "$tmp/a.bin" --vocab 10
expect 2 "$tmp/none.bin: cannot open: No such file or directory" -- $mpengine data inspect "$tmp/none.bin"

# uint32 shards (llm.c's second format, magic 20240801 version 7), as data_common.py writes them:
# every id is checked, the format printed, and a bad id named with its byte offset.
python3 - "$tmp" <<'PY'
import struct, sys
def shard(path, magic, version, ids, code):
    header = [0] * 256
    header[0:3] = [magic, version, len(ids)]
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *header) + struct.pack("<%d%s" % (len(ids), code), *ids))
ids = [(i * 7919) % 128256 for i in range(3000)] + [128255]
shard(sys.argv[1] + "/llama.bin", 20240801, 7, ids, "I")
shard(sys.argv[1] + "/llama_bad.bin", 20240801, 7, ids[:2000] + [128256] + ids[2000:], "I")
shard(sys.argv[1] + "/llama_v1.bin", 20240801, 1, ids, "I")
PY
expect 0 "$tmp/llama.bin: 3001 tokens, 3001 distinct ids, largest id 128255; valid llm.c token shard (uint32 ids, magic 20240801, version 7)" -- \
  $mpengine data inspect "$tmp/llama.bin" --vocab 128256
expect 2 "$tmp/llama_bad.bin: token id 128256 at token 2000 (byte offset 9024) is outside the vocabulary of 128256 ids (0 .. 128255)" -- \
  $mpengine data inspect "$tmp/llama_bad.bin" --vocab 128256
expect 2 "$tmp/llama_v1.bin: token shard version 1, expected 7 with magic 20240801 (llm.c's shards of uint32 tokens)" -- \
  $mpengine data inspect "$tmp/llama_v1.bin"
head -c 5000 "$tmp/llama.bin" > "$tmp/llama_short.bin"
expect 2 "$tmp/llama_short.bin: the header says 3001 tokens, which take 1024 + 4 x 3001 = 13028 bytes, but the file is 5000 bytes (8028 short); the shard is truncated" -- \
  $mpengine data inspect "$tmp/llama_short.bin"

# Usage mistakes.
expect 2 "mpengine data synth: missing option --out FILE: the token shard to write" \
  "run 'mpengine data synth --help' for the options" -- $mpengine data synth --vocab 64
expect 2 "--vocab: must be at most 65536 (the synthetic Markov source draws uint16 ids), got 70000" -- \
  $mpengine data synth --out "$tmp/x.bin" --vocab 70000
expect 2 "--successors: must be at least 2, got 1" -- \
  $mpengine data synth --out "$tmp/x.bin" --vocab 64 --successors 1
expect 2 "$tmp/no_dir/x.bin: cannot create: No such file or directory" -- \
  $mpengine data synth --out "$tmp/no_dir/x.bin" --vocab 64
[ -e "$tmp/x.bin" ] && fail "a failed synth left $tmp/x.bin"
expect 2 "mpengine data: missing action: tokenize, decode, synth or inspect" -- $mpengine data
expect 2 "mpengine data: unknown action 'synt'; did you mean 'synth'?" -- $mpengine data synt
expect 0 "usage: mpengine data tokenize --tokenizer" "mpengine data decode" "mpengine data inspect FILE|GLOB..." "uint32 for vocabularies over 65,536" -- $mpengine data --help
expect 2 "did you mean 'decode'" -- $mpengine data decod
expect 0 "usage: mpengine data synth --out FILE --vocab V" "--successors K" -- \
  $mpengine data synth --help

if [ $failures -ne 0 ]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "all checks passed"
