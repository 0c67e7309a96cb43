#!/usr/bin/env bash
# outside.sh: Assent against raw JetStream, measured from outside (issue 11).
#
# The broker runs as its own process (cmd/broker, embedded NATS on a fresh
# data directory) and the load generator as another (cmd/agent-worker load),
# over loopback TCP. On the same server, in the same run, each measurement is
# taken through Assent and through raw JetStream doing the least a durable
# broker must (agent-worker load --baseline raw), interleaved, K times each:
#
#   auto   automatic decisions: N requests, C at a time, broker in
#          --mode auto-approve (--http ""); throughput and request-to-decision
#          latency.
#   human  the human path: HUMAN_N requests, HUMAN_C at a time, broker in
#          --mode manual (HTTP API on loopback, so anyone may answer); each
#          request approved by the load's approver as soon as it is pending
#          (agent-worker load --answer-as). answer = the approval's publish to
#          the agent receiving the decision; pending = request to the pending
#          event.
#
# Each under every fsync policy in SYNCS, against each baseline in
# BASELINES: raw, whose requester takes each reply as the server routes it
# (before it is stored: under --sync always, before its fsync), and
# raw-stored, whose requester takes each reply only once the stream stored
# it (its RePublish), as Assent's agents take decisions (agent-worker load
# --baseline raw-stored). At the end it prints a markdown table of the
# medians per baseline and every run's JSON line (docs/agent-worker.md
# explains the fields). It exits non-zero if anything fails, a run included
# (an error, or fewer decisions than requests).
#
# Usage (from anywhere in the repository):
#
#   tools/bench/outside.sh
#   N=20000 K=2 tools/bench/outside.sh
#
# Settings, from the environment:
#   N=20000        requests per automatic run        C=64        their concurrency
#   HUMAN_N=5000   requests per human-path run       HUMAN_C=16  their concurrency
#   K=3            runs of each target per case      SYNCS="2m always"
#   PATHS="auto human"   which measurements to take
#   BASELINES="raw raw-stored"   which baselines to measure beside Assent
#   KEEP=1         keep the temporary directory (binaries, broker logs, runs.jsonl)
#   BROKER_BIN=F   run this broker binary instead of building ./cmd/broker
#                  (an earlier commit's, to compare)
#
# The machine should be otherwise idle; on a shared one, run it under a lock
# that other measurements take too (flock /tmp/assent-bench.lock ...).
# Needs go, jq and a free loopback.
set -euo pipefail

if [[ ${1:-} == -h || ${1:-} == --help ]]; then
	sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
	exit 0
fi
if (($# > 0)); then
	echo "outside.sh: no arguments are taken; settings come from the environment (outside.sh -h)" >&2
	exit 2
fi

N=${N:-20000}
C=${C:-64}
HUMAN_N=${HUMAN_N:-5000}
HUMAN_C=${HUMAN_C:-16}
K=${K:-3}
SYNCS=${SYNCS:-2m always}
PATHS=${PATHS:-auto human}
BASELINES=${BASELINES:-raw raw-stored}

for v in N C HUMAN_N HUMAN_C K; do
	if ! [[ ${!v} =~ ^[1-9][0-9]*$ ]]; then
		echo "outside.sh: $v=${!v}: want a positive whole number" >&2
		exit 2
	fi
done
for p in $PATHS; do
	if [[ $p != auto && $p != human ]]; then
		echo "outside.sh: PATHS has \"$p\": want auto, human or both" >&2
		exit 2
	fi
done
for b in $BASELINES; do
	if [[ $b != raw && $b != raw-stored ]]; then
		echo "outside.sh: BASELINES has \"$b\": want raw, raw-stored or both" >&2
		exit 2
	fi
done
for tool in go jq; do
	if ! command -v "$tool" >/dev/null; then
		echo "outside.sh: $tool is not on PATH; install it and run again" >&2
		exit 1
	fi
done

repo=$(cd "$(dirname "$0")/../.." && pwd)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/assent-outside.XXXXXX")
broker_pid=""
load_pid=""

# stop_broker stops the broker this script started, if it runs: SIGTERM,
# then SIGKILL after 20 s.
stop_broker() {
	[[ -n $broker_pid ]] || return 0
	local pid=$broker_pid
	broker_pid=""
	kill -TERM "$pid" 2>/dev/null || return 0
	for _ in $(seq 200); do
		kill -0 "$pid" 2>/dev/null || break
		sleep 0.1
	done
	if kill -0 "$pid" 2>/dev/null; then
		echo "outside.sh: the broker (pid $pid) did not stop within 20 s; killing it" >&2
		kill -KILL "$pid" 2>/dev/null || true
	fi
	wait "$pid" 2>/dev/null || true
}

cleanup() {
	local status=$?
	trap - EXIT INT TERM
	if [[ -n $load_pid ]]; then
		# Interrupted: the load stops, cancelling its requests in flight.
		kill -INT "$load_pid" 2>/dev/null || true
		wait "$load_pid" 2>/dev/null || true
	fi
	stop_broker
	if [[ ${KEEP:-} == 1 || $status -ne 0 ]]; then
		echo "outside.sh: kept $tmp (binaries, broker logs, runs.jsonl)" >&2
	else
		rm -rf "$tmp"
	fi
	exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

progress() { echo "outside.sh: $*" >&2; }

progress "building cmd/broker and cmd/agent-worker into $tmp"
(cd "$repo" && go build -o "$tmp/agent-worker" ./cmd/agent-worker)
if [ -n "${BROKER_BIN:-}" ]; then
	cp "$BROKER_BIN" "$tmp/broker" # another build of the broker, to compare commits
else
	(cd "$repo" && go build -o "$tmp/broker" ./cmd/broker)
fi

nats_url=""
# start_broker MODE SYNC starts a broker on a fresh data directory and waits
# until it says it is ready; nats_url is then where it listens.
start_broker() {
	local mode=$1 sync=$2 http=""
	# In manual mode, anyone may answer only through an open HTTP gateway;
	# without one only announced approver channels are reachable.
	if [[ $mode == manual ]]; then
		http=127.0.0.1:0
	fi
	local data log
	data=$(mktemp -d "$tmp/data.XXXX")
	log="$tmp/broker-$mode-$sync.log"
	"$tmp/broker" --mode "$mode" --sync "$sync" --data "$data" --nats-listen 127.0.0.1:0 \
		--http "$http" --log-json --log-level info >"$log" 2>&1 &
	broker_pid=$!
	progress "broker: --mode $mode --sync $sync (pid $broker_pid, log $log)"
	for _ in $(seq 600); do
		nats_url=$(jq -rR 'fromjson? | select(.msg | startswith("ready:")) | .nats' "$log" | head -n1)
		[[ -n $nats_url ]] && return 0
		if ! kill -0 "$broker_pid" 2>/dev/null; then
			broker_pid=""
			echo "outside.sh: the broker exited before it was ready; its log:" >&2
			tail -n 20 "$log" >&2
			exit 1
		fi
		sleep 0.1
	done
	echo "outside.sh: the broker was not ready within 60 s; its log:" >&2
	tail -n 20 "$log" >&2
	exit 1
}

runs="$tmp/runs.jsonl"
: >"$runs"
paths=($PATHS)
syncs=($SYNCS)
baselines=($BASELINES)
total=$((${#paths[@]} * ${#syncs[@]} * K * (1 + ${#baselines[@]})))
done_runs=0

# run_load PATH SYNC TARGET I ARGS... runs one load and records its result.
run_load() {
	local path=$1 sync=$2 target=$3 i=$4
	shift 4
	local n=$N
	[[ $path == human ]] && n=$HUMAN_N
	done_runs=$((done_runs + 1))
	progress "[$done_runs/$total] $path sync=$sync $target run $i/$K: $n requests"
	# In the background, so that a signal reaches this script's traps at
	# once rather than after the run.
	"$tmp/agent-worker" load --nats-url "$nats_url" --n "$n" --json "$@" >"$tmp/out.json" &
	load_pid=$!
	if ! wait "$load_pid"; then
		load_pid=""
		echo "outside.sh: $path sync=$sync $target run $i failed (agent-worker load exited non-zero; its message is above)" >&2
		exit 1
	fi
	load_pid=""
	local out
	out=$(<"$tmp/out.json")
	jq -c --arg path "$path" --arg sync "$sync" --argjson run "$i" '{path: $path, sync: $sync, run: $run} + .' <<<"$out" >>"$runs"
	local line
	line=$(tail -n1 "$runs")
	jq -r '"  \(.decided_per_second) decided/s, p50 \(.latency_ms.p50) ms, p99 \(.latency_ms.p99) ms" +
		(if .answer_ms then ", answer p50 \(.answer_ms.p50) ms p99 \(.answer_ms.p99) ms, pending p50 \(.pending_ms.p50) ms p99 \(.pending_ms.p99) ms" else "" end) +
		", errors \(.errors)"' <<<"$line" >&2
	if [[ $(jq '.errors' <<<"$line") != 0 || $(jq '.decided' <<<"$line") != "$n" ]]; then
		echo "outside.sh: $path sync=$sync $target run $i: not every request was decided: $line" >&2
		exit 1
	fi
}

for path in "${paths[@]}"; do
	for sync in "${syncs[@]}"; do
		if [[ $path == auto ]]; then
			start_broker auto-approve "$sync"
			args=(--c "$C")
		else
			start_broker manual "$sync"
			args=(--c "$HUMAN_C" --answer-as alice)
		fi
		for i in $(seq "$K"); do
			run_load "$path" "$sync" assent "$i" "${args[@]}"
			for b in "${baselines[@]}"; do
				run_load "$path" "$sync" "$b" "$i" "${args[@]}" --baseline "$b"
			done
		done
		stop_broker
	done
done

# The medians of each case, and Assent's against each baseline: one row per
# fsync policy and baseline.
summary() {
	jq -rs --arg path "$1" '
		def median: sort | if length % 2 == 1 then .[length / 2 | floor] else (.[length / 2 - 1] + .[length / 2]) / 2 end;
		def r: . * 100 | round / 100;
		def med(f): map(f) | median | r;
		map(select(.path == $path)) | group_by(.sync) | .[]
		| (map(select(.target == "assent"))) as $a
		| (map(select(.target != "assent")) | group_by(.target) | .[]) as $b
		| if $path == "auto" then
			[.[0].sync, $b[0].target, ($a | length), ($a | med(.decided_per_second)), ($a | med(.latency_ms.p50)), ($a | med(.latency_ms.p99)),
			 ($b | med(.decided_per_second)), ($b | med(.latency_ms.p50)), ($b | med(.latency_ms.p99)),
			 (($a | med(.decided_per_second)) / ($b | med(.decided_per_second)) | r)]
		  else
			[.[0].sync, $b[0].target, ($a | length), ($a | med(.answer_ms.p50)), ($a | med(.answer_ms.p99)), ($a | med(.pending_ms.p50)), ($a | med(.pending_ms.p99)),
			 ($b | med(.answer_ms.p50)), ($b | med(.answer_ms.p99)), ($b | med(.pending_ms.p50)), ($b | med(.pending_ms.p99)),
			 (($a | med(.answer_ms.p50)) / ($b | med(.answer_ms.p50)) | r), (($a | med(.answer_ms.p99)) / ($b | med(.answer_ms.p99)) | r)]
		  end
		| "| `\(.[0])` | \(.[1]) | " + (.[2:] | map(tostring) | join(" | ")) + " |"' "$runs"
}

echo
if [[ " ${paths[*]} " == *" auto "* ]]; then
	echo "### Automatic decisions: $N requests, $C at a time (medians of $K runs)"
	echo
	echo "raw-jetstream-stored: the baseline's requester takes each reply only once stored, as an agent of Assent takes a decision."
	echo
	echo "| fsync | baseline | runs | assent decided/s | p50 ms | p99 ms | baseline decided/s | p50 ms | p99 ms | assent / baseline throughput |"
	echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
	summary auto
	echo
fi
if [[ " ${paths[*]} " == *" human "* ]]; then
	echo "### The human path: $HUMAN_N requests, $HUMAN_C at a time (medians of $K runs, ms)"
	echo
	echo "answer: the approval's publish to the agent receiving the decision; pending: the request to the approver seeing it pending. raw-jetstream-stored: the baseline's requester takes each reply only once stored, as an agent of Assent takes a decision."
	echo
	echo "| fsync | baseline | runs | assent answer p50 | p99 | pending p50 | p99 | baseline answer p50 | p99 | pending p50 | p99 | assent / baseline answer p50 | p99 |"
	echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
	summary human
	echo
fi
echo "Every run, in order (JSON lines; times in ms):"
echo
echo '```'
cat "$runs"
echo '```'
progress "done: $total runs"
