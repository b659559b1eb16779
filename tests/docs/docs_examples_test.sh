#!/usr/bin/env bash
# tests/docs/docs_examples_test.sh — the README and docs/ cannot drift from the binary, and no
# relative link in them points nowhere.
#
#   docs_examples_test.sh MPENGINE PAGE.md...
#
# 1. Examples. Every fenced block marked ```console is run and checked; every other block
#    (```sh, ```text, ```json, ...) is only shown. In a console block:
#      $ COMMAND            a line that starts with "$ " is a command, run by bash in the page's
#                           working directory with `mpengine` on PATH (the built binary);
#      OUTPUT               the lines up to the next command or the block's end are what the
#                           command prints: its stdout, then its stderr;
#      ...                  a line of three dots alone stands for any number of lines (none
#                           included); the first later line that matches the next expected line
#                           resumes the match;
#      TEXT...              an expected line ending in "..." matches any line starting with TEXT.
#    Trailing blanks are ignored on both sides. A command with no output lines must print
#    nothing. A command must exit 0 unless it ends with a comment "# exit N" (an error example:
#    then it must exit N). Every page gets a fresh working directory holding `examples/` and the
#    test data under `tests/` (links into the runfiles), shared by that page's console blocks in
#    order, so one block may write a file (plan --out) that a later one reads.
#    Only fast, machine-independent commands belong in console blocks: describe, import, plan and
#    schedule on a preset cluster (not cpu-local, whose figures are this machine's), data synth and
#    inspect, and errors. Runs under mpirun stay in ```sh / ```text blocks.
# 2. Links. Every inline link [text](target) and reference definition [name]: target outside
#    code blocks whose target is not a URL (scheme:...) must name an existing file or directory,
#    relative to the page; anchors (#...) are refused (they are not checked: link the page).
#    Targets are looked up in the runfiles first (pages, examples), then next to the page's
#    source file (which the runfiles link to), so a link to any file of the repository works.
#    Every page but the first (the README) must be the target of some link: no orphan pages.
#
# Failures print the page and line of the command or link, what was expected and what came out;
# the last line is "docs examples: N commands, N links checked, N failed".
set -uo pipefail

if [ $# -lt 2 ]; then
  echo "usage: $0 MPENGINE PAGE.md..." >&2
  exit 2
fi

runfiles=$(pwd)
abspath() { case $1 in /*) printf '%s\n' "$1" ;; *) printf '%s\n' "$runfiles/$1" ;; esac; }

mpengine_bin=$(abspath "$1")
shift
pages=()
for p in "$@"; do pages+=("$(abspath "$p")"); done

tmp=${TEST_TMPDIR:-$(mktemp -d)}
bindir=$tmp/bin
mkdir -p "$bindir"
ln -sf "$mpengine_bin" "$bindir/mpengine"

# The environment of every example: the built-in presets whatever this machine calibrated, the
# C locale, no terminal.
export MPENGINE_CALIBRATION=
export LC_ALL=C.UTF-8
export PATH="$bindir:$PATH"
unset TERM

failures=0
commands=0
links=0

fail() {
  echo "FAIL: $*"
  failures=$((failures + 1))
}

# rstrip VAR: strip trailing blanks (and a carriage return) from the named variable.
rstrip() {
  local -n v=$1
  v="${v%"${v##*[![:space:]]}"}"
}

# line_matches EXPECTED ACTUAL
line_matches() {
  local e=$1 a=$2
  [ "$e" == "$a" ] && return 0
  if [ ${#e} -gt 3 ] && [ "${e: -3}" == "..." ]; then
    local prefix=${e%...}
    [[ "$a" == "$prefix"* ]] && return 0
  fi
  return 1
}

# check_output WHERE: compares the global arrays expected and actual; prints the mismatch.
check_output() {
  local where=$1
  local i=0 j=0 ne=${#expected[@]} na=${#actual[@]} reason=""
  while [ $i -lt "$ne" ]; do
    local e=${expected[$i]}
    if [ "$e" == "..." ]; then
      if [ $((i + 1)) -eq "$ne" ]; then j=$na; i=$ne; break; fi
      local next=${expected[$((i + 1))]} k=$j found=0
      while [ $k -lt "$na" ]; do
        if line_matches "$next" "${actual[$k]}"; then found=1; break; fi
        k=$((k + 1))
      done
      if [ $found -eq 0 ]; then
        reason="no output line after line $j matches expected line $((i + 2)): '$next'"
        break
      fi
      j=$k
      i=$((i + 1))
      continue
    fi
    if [ $j -ge "$na" ]; then
      reason="output ended; expected line $((i + 1)): '$e'"
      break
    fi
    if ! line_matches "$e" "${actual[$j]}"; then
      reason="output line $((j + 1)) differs:
    expected: '$e'
    actual:   '${actual[$j]}'"
      break
    fi
    i=$((i + 1))
    j=$((j + 1))
  done
  if [ -z "$reason" ] && [ $j -lt "$na" ]; then
    reason="unexpected output line $((j + 1)): '${actual[$j]}' (end the expected lines with '...' to skip the rest)"
  fi
  if [ -n "$reason" ]; then
    fail "$where: $reason"
    echo "  the whole output:"
    local l
    for l in "${actual[@]}"; do echo "    | $l"; done
    return 1
  fi
  return 0
}

# run_example PAGE LINE COMMAND: runs COMMAND in $workdir, checks exit code and the output
# against the global array expected.
run_example() {
  local where="$1:$2" cmd=$3
  local want=0
  if [[ "$cmd" =~ \#[[:space:]]*exit[[:space:]]+([0-9]+)[[:space:]]*$ ]]; then
    want=${BASH_REMATCH[1]}
  fi
  commands=$((commands + 1))
  local out=$tmp/out.txt err=$tmp/err.txt code
  (cd "$workdir" && timeout 120 bash -c "$cmd" </dev/null >"$out" 2>"$err")
  code=$?
  actual=()
  local l
  while IFS= read -r l || [ -n "$l" ]; do rstrip l; actual+=("$l"); done <"$out"
  while IFS= read -r l || [ -n "$l" ]; do rstrip l; actual+=("$l"); done <"$err"
  if [ "$code" -ne "$want" ]; then
    fail "$where: \$ $cmd -> exit $code (the page shows exit $want)"
    for l in "${actual[@]:0:30}"; do echo "    | $l"; done
    return
  fi
  check_output "$where: \$ $cmd" || true
}

# check_link PAGE LINE TARGET (the page's runfiles path; messages name it by $rel)
declare -A linked=()
check_link() {
  local page=$1 line=$2 target=$3
  case $target in
    [a-zA-Z]*:*) return ;;          # a URL (https:, mailto:, ...)
  esac
  links=$((links + 1))
  local where="$rel:$line"
  case $target in
    *'#'*)
      fail "$where: link '$target' has an anchor; anchors are not checked, link the page alone"
      return
      ;;
    '')
      fail "$where: empty link target"
      return
      ;;
  esac
  local dir real_dir resolved=""
  dir=$(dirname "$page")
  if [ -e "$dir/$target" ]; then
    resolved="$dir/$target"
  else
    real_dir=$(dirname "$(readlink -f "$page")")
    if [ -e "$real_dir/$target" ]; then resolved="$real_dir/$target"; fi
  fi
  if [ -z "$resolved" ]; then
    fail "$where: link '$target' names no file (relative to $(basename "$page"))"
    return
  fi
  linked["$(readlink -f "$resolved")"]=1
}

page_index=0
for page in "${pages[@]}"; do
  page_index=$((page_index + 1))
  if [ ! -f "$page" ]; then
    fail "$page: no such page"
    continue
  fi
  rel=${page#"$runfiles"/}
  rel=${rel#./}
  workdir=$tmp/work/$page_index
  mkdir -p "$workdir"
  for d in examples tests; do
    if [ -e "$runfiles/$d" ]; then ln -sfn "$runfiles/$d" "$workdir/$d"; fi
  done

  in_fence=0
  kind=""
  cmd=""
  cmd_line=0
  expected=()
  lineno=0
  while IFS= read -r line || [ -n "$line" ]; do
    lineno=$((lineno + 1))
    if [ $in_fence -eq 0 ]; then
      if [[ "$line" =~ ^[[:space:]]*\`\`\`([A-Za-z0-9_-]*) ]]; then
        in_fence=1
        kind=${BASH_REMATCH[1]}
        cmd=""
        expected=()
        continue
      fi
      # Links: inline [text](target) and reference definitions [name]: target.
      rest=$line
      while [[ "$rest" =~ \]\(([^\)[:space:]]*)[^\)]*\) ]]; do
        check_link "$page" "$lineno" "${BASH_REMATCH[1]}"
        rest=${rest#*"${BASH_REMATCH[0]}"}
      done
      if [[ "$line" =~ ^\[[^]]+\]:[[:space:]]+([^[:space:]]+) ]]; then
        check_link "$page" "$lineno" "${BASH_REMATCH[1]}"
      fi
      continue
    fi
    # Inside a fence.
    if [[ "$line" =~ ^[[:space:]]*\`\`\`[[:space:]]*$ ]]; then
      if [ "$kind" == "console" ]; then
        if [ -n "$cmd" ]; then
          run_example "$rel" "$cmd_line" "$cmd"
        else
          fail "$rel:$lineno: a console block without a command ('\$ mpengine ...')"
        fi
      fi
      in_fence=0
      kind=""
      cmd=""
      continue
    fi
    [ "$kind" == "console" ] || continue
    if [[ "$line" == '$ '* ]]; then
      if [ -n "$cmd" ]; then run_example "$rel" "$cmd_line" "$cmd"; fi
      cmd=${line:2}
      cmd_line=$lineno
      expected=()
    elif [ -z "$cmd" ]; then
      fail "$rel:$lineno: output before the first command of a console block"
      kind="broken"   # report the block once, run none of it
    else
      rstrip line
      expected+=("$line")
    fi
  done <"$page"
  if [ $in_fence -eq 1 ]; then fail "$rel: a code block is never closed"; fi
done

# No orphan pages: every page after the first is linked from some page.
for page in "${pages[@]:1}"; do
  if [ -z "${linked["$(readlink -f "$page")"]:-}" ]; then
    fail "${page#"$runfiles"/}: no page links to it"
  fi
done

if [ $commands -eq 0 ]; then fail "no console example found in ${#pages[@]} pages"; fi
echo "docs examples: $commands commands, $links links checked, $failures failed"
[ $failures -eq 0 ]
