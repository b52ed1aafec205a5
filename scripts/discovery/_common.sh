# Shared by the example discovery scripts (sourced, not run). See README.md.
#
# Everything a schedule needs is a pure function of (seed, elapsed periods) or of the
# job's progress, plus a start time kept in the state dir, so that the same seed gives
# the same host sequence run after run, and every poll of one run agrees with the last.

set -eu

# The state dir for schedule $1: a subdir of ER_DISCOVERY_STATE (default: a per-user
# dir under /tmp), one per schedule so that schedules sharing a base never mix.
er_state_dir() {
  local dir=${ER_DISCOVERY_STATE:-/tmp/elasticrun-discovery-$UID}/$1
  mkdir -p "$dir"
  printf '%s\n' "$dir"
}

# Prints hosts 1..N as "<prefix>i:1": one loopback address, one slot, per worker.
er_print_hosts() {
  local n=$1 prefix=${ER_HOST_PREFIX:-127.0.0.} i
  for ((i = 1; i <= n; i++)); do printf '%s%d:1\n' "$prefix" "$i"; done
}

# Seconds since this schedule first ran with this state dir. The first run creates the
# start file with O_EXCL (noclobber), so two overlapping polls cannot disagree.
er_elapsed() {
  local state=$1 now
  now=$(date +%s)
  (set -C; printf '%s\n' "$now" > "$state/start") 2>/dev/null || true
  local start
  read -r start < "$state/start"
  printf '%s\n' $((now - start))
}

# Requires VALUE ($2) to be a positive integer; the message names the setting ($1).
er_positive() {
  local name=$1 value=$2
  if ! [[ $value =~ ^[0-9]+$ ]] || ((value < 1)); then
    echo "$0: $name must be a positive integer, got '$value'" >&2
    exit 2
  fi
}

# The worker count after K resize events of size STEP, starting at START, between MIN
# and MAX: at the max always shrink, at the min always grow, otherwise up or down with
# equal chance. The coin is a 31-bit LCG seeded with SEED, so the walk is reproducible.
er_walk() {
  local start=$1 step=$2 min=$3 max=$4 k=$5 seed=$6
  local n=$start x=$((seed & 0x7fffffff)) i
  for ((i = 1; i <= k; i++)); do
    x=$(((x * 1103515245 + 12345) & 0x7fffffff))
    if ((n >= max)); then
      n=$((n - step))
    elif ((n <= min)); then
      n=$((n + step))
    elif (((x >> 16) & 1)); then
      n=$((n + step))
    else
      n=$((n - step))
    fi
    ((n > max)) && n=$max
    ((n < min)) && n=$min
  done
  printf '%s\n' "$n"
}

# Appends "elapsed-seconds N" to state/history when N differs from the last entry, for
# demos and tests that want to know when the schedule resized.
er_record() {
  local state=$1 elapsed=$2 n=$3 last=""
  [[ -s $state/history ]] && last=$(tail -n 1 "$state/history") && last=${last#* }
  [[ $last == "$n" ]] || printf '%s %s\n' "$elapsed" "$n" >> "$state/history"
}

# A resizing schedule: start at ER_MAX_NP (8), every period seconds +-step.
er_resizing_schedule() {
  local name=$1 step=$2 default_period=$3
  local period=${ER_PERIOD:-${PERIOD:-$default_period}} seed=${ER_SEED:-1}
  local min=${ER_MIN_NP:-2} max=${ER_MAX_NP:-8}
  er_positive ER_PERIOD "$period"; er_positive ER_MIN_NP "$min"; er_positive ER_MAX_NP "$max"
  [[ $seed =~ ^[0-9]+$ ]] || { echo "$0: ER_SEED must be a non-negative integer, got '$seed'" >&2; exit 2; }
  local state elapsed n
  state=$(er_state_dir "$name")
  elapsed=$(er_elapsed "$state")
  n=$(er_walk "$max" "$step" "$min" "$max" $((elapsed / period)) "$seed")
  er_record "$state" "$elapsed" "$n"
  echo "# $name: seed $seed, period ${period}s, event $((elapsed / period)): $n workers"
  er_print_hosts "$n"
}
