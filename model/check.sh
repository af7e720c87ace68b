#!/usr/bin/env bash
# Model checks of model/locstatus.pml with spin (model/README.md says what each run proves).
#
#   model/check.sh              every run below; exit 1 on any counter-example or mismatch
#                               (independent runs in parallel, LOCSTATUS_MODEL_JOBS at once,
#                               default nproc)
#   model/check.sh RUN...       the named runs
#   model/check.sh --list       the run names, one a line
#   model/check.sh --regen [VARIANT...]
#                               search the variants again (all, or the named ones) and write
#                               their counter-examples to model/trails/ (after a model change)
#
# A protocol run (safety, bitstate, ltl, acyclic) passes when pan finds no error. A variant
# run replays the counter-example kept in model/trails/NAME.trail with the variant's flags: it
# passes when the replay still tells the story kept in model/trails/NAME.txt, which ends with
# the property the variant violates. Needs spin and gcc (scripts/setup.sh installs them).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
model="$here/locstatus.pml"
trails="$here/trails"

# name | kind | spin -D flags
# The fixed protocol: exhaustive for 2 operators x 2 workers x 1 location, every fault kind.
RUNS=(
  "base|safety|-DNOPR=2 -DNOPS=1"
  "sync|safety|-DNOPR=2 -DNOPS=1 -DOPS_SET=3"
  "join|safety|-DNOPR=2 -DNOPS=1 -DDOWN=2 -DNFIRE=2"
  "ltl|ltl|-DNOPR=2 -DNOPS=1 -DOPS_SET=3 -DNAMB=0 -DNFAIL=0"
  "acyclic|acyclic|-DNOPR=2 -DNOPS=1 -DOPS_SET=3 -DNAMB=0 -DNFAIL=0"
  "workers3|bitstate|-DNW=3 -DNOPR=2 -DNOPS=1 -DNAMB=0 -DNFAIL=0"
  "ops4|bitstate|-DNOPR=2 -DNOPS=2 -DNFAULT=0 -DNAMB=0 -DNFAIL=0"
)
# name | search (bfs: shortest counter-example; dfs) | spin -D flags
# Seeded bugs of the hostile review (issues 14, 15), design requirements, and findings: the
# code on main differs from the protocol checked above (model/README.md, "Findings").
VARIANTS=(
  "skew_settle|bfs|-DBUG_SKEW_SETTLE -DNOPR=2 -DNOPS=1"
  "skew_resume|bfs|-DBUG_SKEW_RESUME -DNOPR=2 -DNOPS=1 -DNFAULT=0 -DNAMB=0 -DNFAIL=0"
  "landed_window|bfs|-DBUG_LANDED_WINDOW -DNOPR=2 -DNOPS=1 -DNFAULT=0 -DNFAIL=0"
  "actor|bfs|-DBUG_ACTOR -DNOPR=2 -DNOPS=1 -DNFAULT=0 -DNAMB=0 -DNFAIL=0"
  "base_exception|bfs|-DBUG_BASEEXC -DNOPR=1 -DNOPS=1 -DNFAULT=0 -DNAMB=0"
  "ack_incarnation|dfs|-DBUG_ACK_NO_INCARNATION -DINIT_GEN=2 -DOPS_SET=3 -DNOPR=2 -DNOPS=2 -DNFAULT=0 -DNAMB=0 -DNFAIL=0"
  "on_remove_missed|bfs|-DBUG_ON_REMOVE -DOPS_SET=3 -DNOPR=2 -DNOPS=1 -DNAMB=0 -DNFAIL=0"
  "no_fence|bfs|-DBUG_NO_FENCE -DNOPR=2 -DNOPS=1 -DNAMB=0 -DNFAIL=0"
  "fence_margin|bfs|-DBUG_FENCE_MARGIN -DNOPR=2 -DNOPS=1 -DNAMB=0 -DNFAIL=0"
  "early_unfence|bfs|-DBUG_EARLY_UNFENCE -DNOPR=2 -DNOPS=1 -DNAMB=0 -DNFAIL=0"
  "fire_no_cas|bfs|-DBUG_FIRE_NO_CAS -DNOPR=2 -DNOPS=2 -DNFAULT=0 -DNAMB=0 -DNFAIL=0"
  "one_write_settle|bfs|-DFINDING_ONE_WRITE_SETTLE -DNOPR=2 -DNOPS=1 -DDOWN=2 -DNAMB=0 -DNFAIL=0"
  "remove_race|bfs|-DFINDING_REMOVE_RACE -DNOPR=2 -DNOPS=1 -DNAMB=0 -DNFAIL=0"
  "stale_applied|bfs|-DFINDING_STALE_APPLIED -DINIT_GEN=1 -DOPS_SET=3 -DNOPR=2 -DNOPS=2 -DNFAULT=0 -DNAMB=0 -DNFAIL=0"
  "fence_remove|dfs|-DFINDING_FENCE_REMOVE -DOPS_SET=3 -DNOPR=2 -DNOPS=2 -DNAMB=0 -DNFAIL=0"
)

PAN_DEPTH=-m1000000     # longer than any run of the model (depth reached is reported)
HASH=-w24               # exhaustive runs: 2^24 hash slots, states stored exactly (COLLAPSE)
BITS=-w28               # bitstate runs: a 2^28-bit (32 MB) state table

field() { local IFS='|'; read -r -a parts <<< "$1"; echo "${parts[$2]}"; }

lookup() {  # lookup NAME -> "kind|flags" for a run, "variant|search|flags" for a variant
  local e
  for e in "${RUNS[@]}"; do [ "$(field "$e" 0)" = "$1" ] && { echo "$(field "$e" 1)|$(field "$e" 2)"; return; }; done
  for e in "${VARIANTS[@]}"; do [ "$(field "$e" 0)" = "$1" ] && { echo "variant|$(field "$e" 1)|$(field "$e" 2)"; return; }; done
  echo "unknown run: $1 (see --list)" >&2
  return 2
}

work=""
cleanup() { [ -n "$work" ] && rm -rf "$work"; return 0; }
trap cleanup EXIT

fresh() {  # a fresh work directory holding the model
  cleanup
  work="$(mktemp -d)"
  cp "$model" "$work/"
}

# build FLAGS GCC_FLAGS: generate and compile the verifier
build() {
  fresh
  (cd "$work" && spin $1 -a locstatus.pml > spin.out 2>&1) || { cat "$work/spin.out"; return 1; }
  (cd "$work" && gcc -O2 -w $2 -o pan pan.c) || return 1
}

summary() {  # states and time of a pan run
  local states secs
  states="$(grep -Eo '^ *[0-9.e+]+ states, stored' "$work/pan.out" | grep -Eo '[0-9.e+]+' | head -1)"
  secs="$(grep -Eo 'elapsed time [0-9.e+]+' "$work/pan.out" | grep -Eo '[0-9.e+]+$' | head -1)"
  echo "${states:-?} states, ${secs:-?} s"
}

run_protocol() {  # NAME KIND FLAGS
  local name="$1" kind="$2" flags="$3" gccf panf
  case "$kind" in
    safety)   gccf="-DSAFETY -DNOCLAIM -DCOLLAPSE -DNOBOUNDCHECK"; panf="$PAN_DEPTH $HASH" ;;
    bitstate) gccf="-DSAFETY -DNOCLAIM -DBITSTATE -DNOBOUNDCHECK"; panf="$PAN_DEPTH $BITS" ;;
    ltl)      gccf="-DCOLLAPSE -DNFAIR=5 -DNOBOUNDCHECK"; panf="$PAN_DEPTH $HASH -a -f" ;;
    acyclic)  gccf="-DNP -DNOCLAIM -DCOLLAPSE -DNOBOUNDCHECK"; panf="$PAN_DEPTH $HASH -l" ;;
    *) echo "bad kind $kind" >&2; return 2 ;;
  esac
  build "$flags" "$gccf" || { echo "FAIL $name: could not build the verifier"; return 1; }
  (cd "$work" && ./pan $panf > pan.out 2>&1) || true
  if grep -q 'errors: 0$' "$work/pan.out" && ! grep -q 'max search depth too small' "$work/pan.out"; then
    echo "ok   $name ($kind): $(summary)"
  else
    echo "FAIL $name ($kind): $(summary)"
    grep -E 'pan:|VIOLATED|error|violated|cycle' "$work/pan.out" | head -5
    [ -f "$work/locstatus.pml.trail" ] && (cd "$work" && spin -t $flags locstatus.pml 2>&1 \
      | grep -E '^ *(MSC|VIOLATED):' | sed 's/^ *//' | tail -40)
    return 1
  fi
}

story() {  # FLAGS TRAIL: the replay's narration, one event a line
  (cd "$work" && spin -t -k "$2" $1 locstatus.pml 2>&1) | grep -E '^ *(MSC|VIOLATED):' | sed 's/^ *//'
}

run_variant() {  # NAME FLAGS: the kept counter-example still reproduces
  local name="$1" flags="$2" got
  if [ ! -f "$trails/$name.trail" ] || [ ! -f "$trails/$name.txt" ]; then
    echo "FAIL $name (variant): no kept counter-example (model/check.sh --regen $name)"
    return 1
  fi
  fresh
  got="$(story "$flags" "$trails/$name.trail")"
  if [ "$got" = "$(cat "$trails/$name.txt")" ] && [[ "$(tail -1 <<< "$got")" == VIOLATED:* ]]; then
    echo "ok   $name (variant): $(tail -1 <<< "$got")"
  else
    echo "FAIL $name (variant): the kept trail no longer tells its story (model changed?"
    echo "     regenerate with: model/check.sh --regen $name, then review the diff)"
    diff <(cat "$trails/$name.txt") <(echo "$got") | head -20 || true
    return 1
  fi
}

regen() {  # NAME SEARCH FLAGS: search the variant, keep its counter-example
  local name="$1" search="$2" flags="$3" gccf="-DSAFETY -DNOCLAIM -DCOLLAPSE"
  [ "$search" = bfs ] && gccf="$gccf -DBFS"
  build "$flags" "$gccf" || return 1
  (cd "$work" && ./pan $PAN_DEPTH $HASH > pan.out 2>&1) || true
  if [ ! -f "$work/locstatus.pml.trail" ]; then
    echo "FAIL $name: the variant passes (no counter-example): $(summary)"
    return 1
  fi
  mkdir -p "$trails"
  cp "$work/locstatus.pml.trail" "$trails/$name.trail"
  story "$flags" "$trails/$name.trail" > "$trails/$name.txt"
  echo "kept $name: $(wc -l < "$trails/$name.txt") events, $(tail -1 "$trails/$name.txt") ($(summary))"
}

names() { local e; for e in "${RUNS[@]}" "${VARIANTS[@]}"; do field "$e" 0; done; }

[ "${1:-}" = --list ] && { names; exit 0; }
command -v spin >/dev/null || { echo "spin is not installed (scripts/setup.sh installs it)" >&2; exit 2; }
command -v gcc >/dev/null || { echo "gcc is not installed (scripts/setup.sh installs it)" >&2; exit 2; }

case "${1:-}" in
  --regen)
    shift
    todo=("$@"); [ ${#todo[@]} -eq 0 ] && for e in "${VARIANTS[@]}"; do todo+=("$(field "$e" 0)"); done
    status=0
    for n in "${todo[@]}"; do
      spec="$(lookup "$n")"
      [ "$(field "$spec" 0)" = variant ] || { echo "$n is not a variant" >&2; exit 2; }
      regen "$n" "$(field "$spec" 1)" "$(field "$spec" 2)" || status=1
    done
    exit $status ;;
esac

todo=("$@"); [ ${#todo[@]} -eq 0 ] && mapfile -t todo < <(names)
for n in "${todo[@]}"; do lookup "$n" > /dev/null || exit 2; done

one() {  # NAME: one run or variant, in a work directory of its own
  local spec
  spec="$(lookup "$1")"
  work=""
  trap cleanup EXIT
  if [ "$(field "$spec" 0)" = variant ]; then
    run_variant "$1" "$(field "$spec" 2)"
  else
    run_protocol "$1" "$(field "$spec" 0)" "$(field "$spec" 1)"
  fi
}

# The runs are independent: up to LOCSTATUS_MODEL_JOBS at once (default: the cores, nproc),
# started in the order above (the long protocol runs first); results printed in that order.
jobs_max="${LOCSTATUS_MODEL_JOBS:-$(nproc 2>/dev/null || echo 1)}"
[[ "$jobs_max" =~ ^[1-9][0-9]*$ ]] || { echo "LOCSTATUS_MODEL_JOBS must be a positive integer" >&2; exit 2; }
out="$(mktemp -d)"
trap 'cleanup; rm -rf "$out"' EXIT
start=$(date +%s)
running=0
for i in "${!todo[@]}"; do
  if [ "$running" -ge "$jobs_max" ]; then wait -n || true; running=$((running - 1)); fi
  ( one "${todo[$i]}" > "$out/$i.log" 2>&1; echo $? > "$out/$i.rc" ) &
  running=$((running + 1))
done
wait
status=0
for i in "${!todo[@]}"; do
  cat "$out/$i.log"
  [ "$(cat "$out/$i.rc" 2>/dev/null || echo 1)" = 0 ] || status=1
done
[ ${#todo[@]} -gt 1 ] && echo "model checks finished in $(( $(date +%s) - start )) s ($jobs_max at once)"
exit $status
