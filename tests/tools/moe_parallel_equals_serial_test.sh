#!/usr/bin/env bash
# tests/tools/moe_parallel_equals_serial_test.sh — DESIGN.md principle 2 for mixture-of-experts
# models, at ep 1 and with expert parallelism (issue 33, below): tests/tools/testdata/tiny-moe.json
# (4 Qwen2-MoE-shaped blocks: 8 experts of width 27 and a gated shared expert of width 45,
# neither divisible by tp: they are
# whole on every tp rank; top 1, load-balancing and z-losses) trained 20 steps on
# tp 2 with sequence parallelism, pp 2 (1f1b, zb-h1, interleaved with v = 2), dp 2, ZeRO 1, 2
# (with sequence parallelism, interleaved and zb-h1) and 3 (at dp 2 x pp 2 x tp 2), full and selective recomputation, and context
# parallelism (cp 2 alone, with pp 2 x tp 2 zb-h1, and with dp 2, ZeRO-3 and full recomputation:
# the router statistics summed over the cp group, the aux losses' gradients weighted by cp) gives the
# loss of the one-rank run at every step within 1e-5 relative, the same gradient norm, the same
# held-out loss (--eval-every 10) and the same final weights (a checkpoint exported as a Hugging
# Face model.safetensors): relative L2 difference at most 1e-5, elementwise at most 1.5e-4 (see
# parallel_equals_serial_test.sh for why). The auxiliary losses are per micro-batch over all
# layers, so a pipeline carries the router statistics with the activations and back.
#
# Experts that receive no token: a last pair of runs (one rank, and dp 2 x pp 2 x tp 2) has
# micro-batches of 1 x 4 tokens, each routed to 1 of 8 experts, so at least 4 experts of every
# layer receive no token in every micro-batch; they must train without a crash and agree too.
#
# Resharding: a checkpoint saved after step 10 at dp 2 x pp 2 x tp 2 with ZeRO-3 resumes on one
# rank, and its steps 11-20 give the uninterrupted one-rank run's losses within 1e-5 relative.
#
# Expert parallelism (ep > 1, folded over the dp x cp replicas: each rank holds 8 / ep experts,
# tokens reach them by all-to-all, the experts' gradients are summed over the expert-data-parallel
# group): ep 2 (dp 2), ep 4 (dp 4), ep 2 with tp 2 and sequence parallelism, with pp 2 (1f1b, zb-h1,
# and interleaved v = 2 with full recomputation: the dispatch reruns), with dp 4 (expert-dp 2), with
# cp 2 (dp 1: ep folded over cp), and with ZeRO 1, 2 (pp 2) and 3 (tp 2 with sequence parallelism)
# at dp 4 (the state cut over the expert-dp group of 2) agree with the one-rank run as above
# (losses, norms, held-out losses, final weights exported from their checkpoints, which hold every
# expert whole); the experts-without-tokens pair runs at ep 2 too (2 tokens a micro-batch on each of
# the ep group's 2 ranks, top 1 of 8: at least 4 experts of every layer get no token on any rank);
# an ep 2 x dp 4 x tp 2 ZeRO-3 checkpoint of step 10 resumes on one rank, and the ep-1 ZeRO-3 one
# above resumes at ep 2 x pp 2, both giving the uninterrupted run's steps 11-20.
#
# Capacity factor: capacity_factor 1.0 (tokens beyond an expert's capacity dropped) at one rank,
# dp 2 x ep 2, pp 2 and ep 2 x tp 2 (sequence parallel) agree as above (the last section).
#
# The plans give layers_per_stage, so each layout's stages are the ones named.
set -uo pipefail
mpengine=${1:-${MPENGINE:-tools/mpengine}}
model_src=${2:-tests/tools/testdata/tiny-moe.json}
tmp=${TEST_TMPDIR:-$(mktemp -d)}/moe_parallel_equals_serial
rm -rf "$tmp" && mkdir -p "$tmp"
failures=0
source "$(dirname "${BASH_SOURCE[0]}")/cli_expect.sh" || { echo "cannot load cli_expect.sh"; exit 1; }
mpi_ranks_env
cp "$model_src" "$tmp/tiny-moe.json"

# plan NAME DP PP TP SCHEDULE VIRTUAL SEQUENCE_PARALLEL ZERO RECOMPUTE STAGES [MICRO SEQ CP EP]
plan() {
  local name=$1 dp=$2 pp=$3 tp=$4 schedule=$5 v=$6 sp=$7 zero=$8 recompute=$9 stages=${10}
  local micro=${11:-2} seq=${12:-32} cp=${13:-1} ep=${14:-1}
  cat > "$tmp/$name.json" <<JSON
{"model": "tiny-moe.json", "cluster": "cpu-local",
 "parallel": {"dp": $dp, "cp": $cp, "pp": $pp, "tp": $tp, "ep": $ep, "virtual_stages": $v, "sequence_parallel": $sp, "zero_stage": $zero},
 "layers_per_stage": $stages,
 "batch": {"global_batch": 8, "micro_batch": $micro, "num_micro_batches": $((8 / (dp * micro))), "seq_len": $seq},
 "schedule": "$schedule", "recompute": "$recompute",
 "training": {"steps": 20, "learning_rate": 3e-3, "warmup_steps": 2, "seed": 11}}
JSON
}

column() { grep -v '"val_loss"' "$1" | awk -F"\"$2\": " '{ split($2, a, ","); print a[1] }'; }
val_losses() { grep '"val_loss"' "$1" | awk -F'"val_loss": ' '{ split($2, a, ","); print a[1] }'; }
floats() { # the floats of a Hugging Face directory's model.safetensors, one per line
  local file=$1/model.safetensors
  od -An -v -f -j "$((8 + $(od -An -t u8 -N 8 "$file")))" "$file" | tr -s ' ' '\n' | sed '/^$/d'
}
worst_relative() { # worst_relative A B: "ok|bad WORST" of two columns, within 1e-5 relative
  paste -d' ' <(cat "$1") <(cat "$2") | awk '
    NF != 2 { bad = 1 }
    { d = $2 - $1; if (d < 0) d = -d; r = d / ($1 < 0 ? -$1 : $1); if (r > worst) worst = r; n++ }
    END { printf "%s %.3g", (!bad && n > 0 && worst <= 1e-5 ? "ok" : "bad"), worst }'
}

run() { # run NAME: trains plan NAME, keeping its metrics and final weights (an HF export)
  local name=$1 out code
  rm -rf "$tmp/ck-$name" "$tmp/$name.hf"
  out=$($mpengine run --config "$tmp/$name.json" --metrics "$tmp/$name.jsonl" --overwrite-metrics \
        --checkpoint-dir "$tmp/ck-$name" --comm-timeout 120 --eval-every 10 --eval-batches 2 \
        --backend cpu 2>&1)
  code=$?
  if [ $code -ne 0 ] || ! grep -q "^done: 20 steps" <<<"$out"; then
    fail "$name: exit $code, output:"; echo "$out" | tail -15
  fi
  $mpengine export --checkpoint "$tmp/ck-$name" --format hf --out "$tmp/$name.hf" > /dev/null ||
    fail "$name: export --format hf of its checkpoint failed"
}

compare() { # compare NAME SERIAL: losses, norms, held-out losses and weights against SERIAL's
  local name=$1 serial=$2 verdict
  for what in loss grad_norm; do
    column "$tmp/$serial.jsonl" $what > "$tmp/a" && column "$tmp/$name.jsonl" $what > "$tmp/b"
    [ "$(wc -l < "$tmp/b")" = 20 ] || fail "$name: want 20 step lines of --metrics"
    verdict=$(worst_relative "$tmp/a" "$tmp/b")
    [ "${verdict%% *}" = ok ] || fail "$name: $what differs from one rank by more than 1e-5 relative (${verdict#* })"
    echo -n "$name: $what ${verdict#* }; "
  done
  val_losses "$tmp/$serial.jsonl" > "$tmp/a" && val_losses "$tmp/$name.jsonl" > "$tmp/b"
  verdict=$(worst_relative "$tmp/a" "$tmp/b")
  [ "${verdict%% *}" = ok ] && [ "$(wc -l < "$tmp/b")" = 2 ] ||
    fail "$name: held-out loss differs from one rank (${verdict#* })"
  local weights
  weights=$(paste -d' ' <(floats "$tmp/$serial.hf") <(floats "$tmp/$name.hf") | awk '
    NF != 2 { bad = 1 }
    { d = $2 - $1; squares += d * d; norm += $1 * $1; if (d < 0) d = -d; if (d > worst) worst = d; n++ }
    END { l2 = norm > 0 ? sqrt(squares / norm) : 1
          printf "%s relative L2 %.3g, max %.3g over %d", (!bad && n > 0 && l2 <= 1e-5 && worst <= 1.5e-4 ? "ok" : "bad"), l2, worst, n }')
  echo "held-out ${verdict#* }; weights ${weights#* }"
  [ "${weights%% *}" = ok ] || fail "$name: final weights differ from one rank: ${weights#* }"
}

# NAME DP PP TP SCHEDULE VIRTUAL SP ZERO RECOMPUTE STAGES (7 layers: embedding, 4 blocks, norm, head)
layouts=("tp2-sp 1 1 2 1f1b 1 true 0 none [7]"
         "pp2 1 2 1 1f1b 1 false 0 none [3,4]"
         "pp2-zb-h1 1 2 1 zb-h1 1 false 0 none [3,4]"
         "pp2-interleaved-v2 1 2 1 interleaved-1f1b 2 false 0 none [2,2,1,2]"
         "dp2 2 1 1 1f1b 1 false 0 none [7]"
         "dp2-tp2-sp-zero1 2 1 2 1f1b 1 true 1 none [7]"
         "dp2-tp2-sp-zero2 2 1 2 1f1b 1 true 2 none [7]"
         "dp2-pp2-interleaved-v2-zero2 2 2 1 interleaved-1f1b 2 false 2 none [2,2,1,2]"
         "dp2-pp2-zb-h1-zero2 2 2 1 zb-h1 1 false 2 none [3,4]"
         "dp2-pp2-tp2-zero3 2 2 2 1f1b 1 false 3 none [3,4]"
         "pp2-tp2-sp-recompute-full 1 2 2 1f1b 1 true 0 full [3,4]"
         "pp2-tp2-sp-zb-h1-recompute-selective 1 2 2 zb-h1 1 true 0 selective [3,4]"
         "cp2 1 1 1 1f1b 1 false 0 none [7] 2 32 2"
         "cp2-pp2-tp2-sp-zb-h1 1 2 2 zb-h1 1 true 0 none [3,4] 2 32 2"
         "cp2-dp2-zero3-recompute-full 2 1 1 1f1b 1 false 3 full [7] 2 32 2"
         "ep2 2 1 1 1f1b 1 false 0 none [7] 2 32 1 2"
         "ep4 4 1 1 1f1b 1 false 0 none [7] 2 32 1 4"
         "ep2-tp2-sp 2 1 2 1f1b 1 true 0 none [7] 2 32 1 2"
         "ep2-pp2 2 2 1 1f1b 1 false 0 none [3,4] 2 32 1 2"
         "ep2-pp2-zb-h1 2 2 1 zb-h1 1 false 0 none [3,4] 2 32 1 2"
         "ep2-pp2-interleaved-v2-recompute-full 2 2 1 interleaved-1f1b 2 false 0 full [2,2,1,2] 2 32 1 2"
         "ep2-dp4 4 1 1 1f1b 1 false 0 none [7] 2 32 1 2"
         "ep2-cp2 1 1 1 1f1b 1 false 0 none [7] 2 32 2 2"
         "ep2-dp4-zero1 4 1 1 1f1b 1 false 1 none [7] 2 32 1 2"
         "ep2-dp4-pp2-zero2 4 2 1 1f1b 1 false 2 none [3,4] 2 32 1 2"
         "ep2-dp4-tp2-sp-zero3 4 1 2 1f1b 1 true 3 none [7] 2 32 1 2")
plan serial 1 1 1 1f1b 1 false 0 none "[7]"
run serial
for spec in "${layouts[@]}"; do
  set -- $spec
  plan "$@"
  run "$1"
  compare "$1" serial
done

# A dp 2 x pp 2 x tp 2 ZeRO-3 checkpoint of step 10 resumes on one rank.
rm -rf "$tmp/ck-reshard"
expect 0 "done: 20 steps" -- $mpengine run --config "$tmp/dp2-pp2-tp2-zero3.json" --backend cpu \
  --checkpoint-dir "$tmp/ck-reshard" --save-every 10
rm -rf "$tmp/ck-reshard/step-20"
expect 0 "resumed from $tmp/ck-reshard/step-10: 10 of 20 steps done" -- \
  $mpengine run --config "$tmp/serial.json" --backend cpu --checkpoint-dir "$tmp/ck-reshard" --resume \
  --metrics "$tmp/resumed.jsonl" --overwrite-metrics
column "$tmp/serial.jsonl" loss | tail -10 > "$tmp/a" && column "$tmp/resumed.jsonl" loss > "$tmp/b"
verdict=$(worst_relative "$tmp/a" "$tmp/b")
[ "${verdict%% *}" = ok ] && [ "$(wc -l < "$tmp/b")" = 10 ] ||
  fail "a dp 2 x pp 2 x tp 2 ZeRO-3 checkpoint resumed on one rank: steps 11-20 differ (${verdict#* })"
echo "resharded resume (dp2-pp2-tp2-zero3 -> one rank): steps 11-20 loss ${verdict#* }"

resumed() { # resumed PLAN CHECKPOINT_DIR WHAT: PLAN resumes step 10 and gives serial's steps 11-20
  rm -rf "$2/step-20" "$tmp/resumed.jsonl" # a resume appends to its metrics
  expect 0 "resumed from $2/step-10: 10 of 20 steps done" -- \
    $mpengine run --config "$tmp/$1.json" --backend cpu --checkpoint-dir "$2" --resume \
    --metrics "$tmp/resumed.jsonl" --overwrite-metrics --comm-timeout 120
  column "$tmp/serial.jsonl" loss | tail -10 > "$tmp/a" && column "$tmp/resumed.jsonl" loss > "$tmp/b"
  verdict=$(worst_relative "$tmp/a" "$tmp/b")
  [ "${verdict%% *}" = ok ] && [ "$(wc -l < "$tmp/b")" = 10 ] ||
    fail "$3: steps 11-20 differ (${verdict#* })"
  echo "$3: steps 11-20 loss ${verdict#* }"
}
# The same ep-1 checkpoint of step 10 (dp 2 x pp 2 x tp 2, ZeRO-3) resumes at ep 2 x pp 2.
resumed ep2-pp2 "$tmp/ck-reshard" "resharded resume (dp2-pp2-tp2-zero3 -> ep 2 x pp 2)"
# An ep 2 checkpoint holds every expert (and with ZeRO-3 every part): one rank resumes it.
rm -rf "$tmp/ck-ep"
expect 0 "done: 20 steps" -- $mpengine run --config "$tmp/ep2-dp4-tp2-sp-zero3.json" --backend cpu \
  --checkpoint-dir "$tmp/ck-ep" --save-every 10 --comm-timeout 120
resumed serial "$tmp/ck-ep" "resharded resume (ep 2 x dp 4 x tp 2 ZeRO-3 -> one rank)"

# Experts with no token: 4 tokens a micro-batch, top 1 of 8 experts; at ep 2 with 2 tokens a
# micro-batch on each rank, so the ep group's 4 tokens leave at least 4 experts with none.
plan empty-serial 1 1 1 1f1b 1 false 0 none "[7]" 1 4
plan empty-dp2-pp2-tp2 2 2 2 1f1b 1 true 0 none "[3,4]" 1 4
plan empty-ep2-serial 1 1 1 1f1b 1 false 0 none "[7]" 1 2
plan empty-ep2-pp2-tp2 2 2 2 1f1b 1 true 0 none "[3,4]" 1 2 1 2
run empty-serial
run empty-dp2-pp2-tp2
compare empty-dp2-pp2-tp2 empty-serial
run empty-ep2-serial
run empty-ep2-pp2-tp2
compare empty-ep2-pp2-tp2 empty-ep2-serial

# A capacity factor (layers/moe.h): capacity_factor 1.0, each expert keeps its first
# ceil(64 x 1 / 8) = 8 (token, slot) pairs of a micro-batch's 64 tokens, the rest dropped. The
# capacity is per micro-batch on the rank that routes it, so one rank, dp 2 x ep 2 (each rank
# drops among its own micro-batch before the dispatch), pp 2 and ep 2 x tp 2 with sequence
# parallelism (every tp rank routes the whole micro-batch) agree; and the drops change the
# run (its first loss is not the dropless one's).
sed 's/"z_loss_coeff": 0.001}/"z_loss_coeff": 0.001, "capacity_factor": 1.0}/' "$model_src" \
  > "$tmp/tiny-moe-cf.json"
grep -q '"capacity_factor": 1.0' "$tmp/tiny-moe-cf.json" || fail "tiny-moe-cf.json: no capacity_factor"
cf_plan() { plan "$@" && sed -i 's/"model": "tiny-moe.json"/"model": "tiny-moe-cf.json"/' "$tmp/$1.json"; }
cf_plan cf-serial 1 1 1 1f1b 1 false 0 none "[7]"
cf_plan cf-dp2-ep2 2 1 1 1f1b 1 false 0 none "[7]" 2 32 1 2
cf_plan cf-pp2 1 2 1 1f1b 1 false 0 none "[3,4]"
cf_plan cf-ep2-tp2-sp 2 1 2 1f1b 1 true 0 none "[7]" 2 32 1 2
run cf-serial
[ "$(column "$tmp/cf-serial.jsonl" loss | head -1)" != "$(column "$tmp/serial.jsonl" loss | head -1)" ] ||
  fail "capacity_factor 1.0: the first loss is the dropless run's (nothing dropped?)"
for name in cf-dp2-ep2 cf-pp2 cf-ep2-tp2-sp; do
  run $name
  compare $name cf-serial
done

if [ $failures -ne 0 ]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "all checks passed"
