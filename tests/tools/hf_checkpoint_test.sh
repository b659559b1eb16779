#!/usr/bin/env bash
# tests/tools/hf_checkpoint_test.sh — Hugging Face GPT-2 checkpoints in and out (issue 16):
# `run --init-from HF_DIR` of the golden that tools/bench/hf_gpt2_golden.py wrote with
# transformers' GPT2LMHeadModel gives HF's loss on the same (4, 16) batch at step 1, within 1e-5
# relative, on one rank, tp = 2, tp = 4 and pp = 2 (each rank reading its own slices); the golden with
# the "transformer." prefix dropped, as a sharded set, and in BF16 and F16 (against HF's loss with
# the weights so rounded) loads to the same loss; `export --format
# hf` of an unchanged tp = 2 checkpoint is byte for byte the golden's model.safetensors and loads
# back to HF's loss, and a trained pp = 2 x tp = 2 one exports to HF and llm.c files that load to
# one loss; and each refusal
# (a config of another model, a tensor of the wrong shape, a missing tensor) exits 2 with its
# message.
#
# Runs as root and with more ranks than cores (mpengine adds --allow-run-as-root and
# --oversubscribe itself); one BLAS thread per rank.
set -uo pipefail
mpengine=${1:-${MPENGINE:-tools/mpengine}}
testdata=${2:-tests/engine/testdata}
python=${PYTHON:-python3}
tmp=${TEST_TMPDIR:-$(mktemp -d)}/hf_checkpoint
rm -rf "$tmp" && mkdir -p "$tmp"
failures=0
source "$(dirname "${BASH_SOURCE[0]}")/cli_expect.sh" || { echo "cannot load cli_expect.sh"; exit 1; }
mpi_ranks_env

golden=$testdata/hf_gpt2_tiny
tokens=$testdata/hf_gpt2_tiny_tokens.bin
hf_loss=$(cat "$testdata/hf_gpt2_tiny_loss.txt")

plan() { # plan FILE PP TP [MODEL]
  cat > "$1" <<JSON
{"model": "${4:-tiny-gpt.json}", "parallel": {"dp": 1, "pp": $2, "tp": $3},
 "batch": {"global_batch": 4, "micro_batch": 2, "num_micro_batches": 2, "seq_len": 16},
 "training": {"steps": 1, "learning_rate": 1e-3}}
JSON
}
cp examples/models/tiny-gpt.json "$tmp/tiny-gpt.json"
plan "$tmp/one.json" 1 1
plan "$tmp/tp2.json" 1 2
plan "$tmp/pp2.json" 2 1
plan "$tmp/tp4.json" 1 4

# check_loss NAME PLAN DIR: step 1's loss from DIR within 1e-5 relative of HF's.
check_loss() {
  local name=$1 config=$2 dir=$3
  rm -f "$tmp/$name.jsonl"
  expect 0 "initialised from $dir" -- \
    $mpengine run --config "$config" --steps 1 --data "$tokens" --init-from "$dir" --metrics "$tmp/$name.jsonl"
  local loss
  loss=$(awk -F'"loss": ' 'NR == 1 { split($2, a, ","); print a[1] }' "$tmp/$name.jsonl" 2> /dev/null)
  if ! awk -v a="${loss:-nan}" -v b="$hf_loss" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a == a && d <= 1e-5 * b) }'; then
    fail "$name: step 1 loss ${loss:-none}, HF's $hf_loss (want within 1e-5 relative)"
  else
    echo "$name: loss $loss, HF $hf_loss"
  fi
}

check_loss one "$tmp/one.json" "$golden"
check_loss tp2 "$tmp/tp2.json" "$golden"
check_loss pp2 "$tmp/pp2.json" "$golden"
check_loss tp4 "$tmp/tp4.json" "$golden"

# Export: a tp = 2 checkpoint of the golden after one step at a learning rate too small to move
# any weight (1e-30) exports to exactly the golden's model.safetensors (our writer is
# safetensors.torch.save_file's, byte for byte), and loads back to HF's loss; a pp = 2 x tp = 2
# checkpoint after 3 real steps exports to HF and to llm.c files that load to the same loss.
sed 's/"learning_rate": 1e-3/"learning_rate": 1e-30/' "$tmp/tp2.json" > "$tmp/still.json"
expect 0 "done: 1 steps" -- $mpengine run --config "$tmp/still.json" --steps 1 --data "$tokens" --init-from "$golden" --checkpoint-dir "$tmp/ck" --save-every 1
expect 0 "exported $tmp/ck/step-1 (step 1, 212352 parameters) to $tmp/export (Hugging Face checkpoint: config.json and safetensors, fp32)" -- \
  $mpengine export --checkpoint "$tmp/ck" --format hf --out "$tmp/export"
cmp -s "$tmp/export/model.safetensors" "$golden/model.safetensors" ||
  fail "export --format hf: model.safetensors differs from the golden's"
grep -q '"architectures":.*"GPT2LMHeadModel"' "$tmp/export/config.json" && grep -q '"n_inner":.*null' "$tmp/export/config.json" &&
  grep -q '"vocab_size":.*128' "$tmp/export/config.json" && grep -q '"activation_function":.*"gelu_new"' "$tmp/export/config.json" ||
  fail "export --format hf: config.json lacks GPT2Config's fields: $(cat "$tmp/export/config.json")"
check_loss export "$tmp/one.json" "$tmp/export"
expect 2 "--out $tmp/export exists; give --force to write into it, or another --out" -- \
  $mpengine export --checkpoint "$tmp/ck" --format hf --out "$tmp/export"
expect 0 "to $tmp/export (Hugging Face" -- $mpengine export --checkpoint "$tmp/ck" --format hf --out "$tmp/export" --force
expect 2 "--format safetensors: expected llmc or hf" -- $mpengine export --checkpoint "$tmp/ck" --format safetensors --out "$tmp/x"
# --max-shard-size: the files and the index transformers' save_pretrained(max_shard_size="200KB")
# writes, byte for byte (the golden keeps the index and the shards' SHA-256), loading to HF's loss.
expect 0 "to $tmp/sharded_export (Hugging Face" -- \
  $mpengine export --checkpoint "$tmp/ck" --format hf --out "$tmp/sharded_export" --max-shard-size 200KB
cmp -s "$tmp/sharded_export/model.safetensors.index.json" "$testdata/hf_gpt2_tiny_200KB/model.safetensors.index.json" ||
  fail "export --max-shard-size 200KB: the index differs from save_pretrained's"
sums=$(cd "$testdata/hf_gpt2_tiny_200KB" && pwd)/SHA256SUMS
(cd "$tmp/sharded_export" && sha256sum --quiet -c "$sums") ||
  fail "export --max-shard-size 200KB: the shard files differ from save_pretrained's"
[ ! -e "$tmp/sharded_export/model.safetensors" ] || fail "export --max-shard-size 200KB: also wrote model.safetensors"
check_loss sharded_export "$tmp/pp2.json" "$tmp/sharded_export"
expect 2 "--max-shard-size 5XB: expected a size in bytes, or with KB, MB, GB, KiB, MiB or GiB (e.g. 5GB)" -- \
  $mpengine export --checkpoint "$tmp/ck" --format hf --out "$tmp/y" --max-shard-size 5XB
expect 2 "--max-shard-size needs --format hf" -- $mpengine export --checkpoint "$tmp/ck" --out "$tmp/y.bin" --max-shard-size 5GB
plan "$tmp/pp2tp2.json" 2 2
expect 0 "done: 3 steps" -- $mpengine run --config "$tmp/pp2tp2.json" --steps 3 --data "$tokens" --init-from "$golden" --checkpoint-dir "$tmp/ck3" --save-every 3
expect 0 "to $tmp/trained (Hugging Face" -- $mpengine export --checkpoint "$tmp/ck3" --format hf --out "$tmp/trained"
expect 0 "to $tmp/trained.bin (llm.c" -- $mpengine export --checkpoint "$tmp/ck3" --format llmc --out "$tmp/trained.bin"
$mpengine run --config "$tmp/one.json" --steps 1 --data "$tokens" --init-from "$tmp/trained" --metrics "$tmp/trained_hf.jsonl" > /dev/null
$mpengine run --config "$tmp/one.json" --steps 1 --data "$tokens" --init-from "$tmp/trained.bin" --metrics "$tmp/trained_llmc.jsonl" > /dev/null
if ! diff <(cut -d, -f1-2 "$tmp/trained_hf.jsonl") <(cut -d, -f1-2 "$tmp/trained_llmc.jsonl") > /dev/null ||
   [ ! -s "$tmp/trained_hf.jsonl" ]; then
  fail "a trained checkpoint exported to HF and to llm.c loads to different losses: $(cat "$tmp/trained_hf.jsonl" "$tmp/trained_llmc.jsonl")"
fi

# Tensor names without "transformer." (some exports write them so) and a sharded set.
"$python" - "$golden" "$tmp" <<'PY'
import json, os, shutil, struct, sys
golden, tmp = sys.argv[1], sys.argv[2]
def read(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    meta = header.pop("__metadata__", None)
    return meta, {k: (v["dtype"], v["shape"], data[v["data_offsets"][0]:v["data_offsets"][1]]) for k, v in header.items()}
def write(path, meta, tensors):
    header, blobs, at = {}, [], 0
    if meta is not None: header["__metadata__"] = meta
    for k in sorted(tensors):
        dtype, shape, blob = tensors[k]
        header[k] = {"dtype": dtype, "shape": shape, "data_offsets": [at, at + len(blob)]}
        blobs.append(blob); at += len(blob)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text))); f.write(text); f.write(b"".join(blobs))
def dir_with(name, tensors_by_file, meta):
    d = os.path.join(tmp, name); os.makedirs(d, exist_ok=True)
    shutil.copy(os.path.join(golden, "config.json"), d)
    for file, tensors in tensors_by_file.items(): write(os.path.join(d, file), meta, tensors)
    return d
meta, tensors = read(os.path.join(golden, "model.safetensors"))
# BF16 and F16 copies, rounded to nearest even as torch rounds (the golden recorded HF's loss
# with its weights rounded so).
def bf16(blob):
    out = bytearray()
    for (u,) in struct.iter_unpack("<I", blob):
        out += struct.pack("<H", ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF)
    return bytes(out)
def f16(blob):
    return b"".join(struct.pack("<e", v) for (v,) in struct.iter_unpack("<f", blob))
dir_with("bf16", {"model.safetensors": {k: ("BF16", v[1], bf16(v[2])) for k, v in tensors.items()}}, meta)
dir_with("f16", {"model.safetensors": {k: ("F16", v[1], f16(v[2])) for k, v in tensors.items()}}, meta)
dir_with("noprefix", {"model.safetensors": {k.replace("transformer.", "", 1): v for k, v in tensors.items()}}, meta)
names = sorted(tensors)
files = {"model-00001-of-00002.safetensors": {k: tensors[k] for k in names[::2]},
         "model-00002-of-00002.safetensors": {k: tensors[k] for k in names[1::2]}}
d = dir_with("sharded", files, meta)
with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
    json.dump({"metadata": {"total_size": sum(len(v[2]) for v in tensors.values())},
               "weight_map": {k: f for f, ts in files.items() for k in ts}}, f, indent=2)
# Refusals: c_fc.weight of another shape (transposed), a missing tensor, a config of another model.
bad = dict(tensors); dt, shape, blob = bad["transformer.h.1.mlp.c_fc.weight"]
bad["transformer.h.1.mlp.c_fc.weight"] = (dt, shape[::-1], blob)
dir_with("badshape", {"model.safetensors": bad}, meta)
dir_with("missing", {"model.safetensors": {k: v for k, v in tensors.items() if k != "transformer.ln_f.bias"}}, meta)
# GPT-2's own config.json has dropouts of 0.1: how it was trained, not what the weights are.
d = dir_with("dropout", {"model.safetensors": tensors}, meta)
config = json.load(open(os.path.join(d, "config.json")))
config.update(resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.1)
json.dump(config, open(os.path.join(d, "config.json"), "w"))
d = dir_with("badconfig", {"model.safetensors": tensors}, meta)
config = json.load(open(os.path.join(d, "config.json"))); config["n_layer"] = 3
json.dump(config, open(os.path.join(d, "config.json"), "w"))
PY
check_loss noprefix "$tmp/one.json" "$tmp/noprefix"
hf_loss=$(cat "$testdata/hf_gpt2_tiny_loss_bf16.txt") check_loss bf16_tp2 "$tmp/tp2.json" "$tmp/bf16"
hf_loss=$(cat "$testdata/hf_gpt2_tiny_loss_f16.txt") check_loss f16 "$tmp/one.json" "$tmp/f16"
check_loss sharded_tp2 "$tmp/tp2.json" "$tmp/sharded"
check_loss dropout "$tmp/one.json" "$tmp/dropout"

expect 2 "$tmp/badshape/model.safetensors: tensor \"transformer.h.1.mlp.c_fc.weight\": expected F16, BF16 or F32 of shape [64, 256], found F32 of shape [256, 64]" -- \
  $mpengine run --config "$tmp/one.json" --steps 1 --init-from "$tmp/badshape"
expect 2 "$tmp/missing/model.safetensors: no tensor \"transformer.ln_f.bias\"" -- \
  $mpengine run --config "$tmp/one.json" --steps 1 --init-from "$tmp/missing"
expect 2 "$tmp/badconfig/config.json: n_layer is 3 in the checkpoint but 4 in the model description ($tmp/tiny-gpt.json)" -- \
  $mpengine run --config "$tmp/one.json" --steps 1 --init-from "$tmp/badconfig"
expect 2 "$tmp/badshape/model.safetensors: tensor \"transformer.h.1.mlp.c_fc.weight\"" -- \
  $mpengine run --config "$tmp/tp2.json" --steps 1 --init-from "$tmp/badshape"
mkdir -p "$tmp/empty"
expect 2 "$tmp/empty" -- $mpengine run --config "$tmp/one.json" --steps 1 --init-from "$tmp/empty"

if [ "$failures" -ne 0 ]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "all checks passed"
