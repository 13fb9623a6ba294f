#!/usr/bin/env bash
# On a lent GPU machine, in one device call: where an in-process step goes (profile_round.py, $OUT/profile.txt), a
# round's forwards in process against on their replicas, back to back and after an idle gap (replica_forward.py), then
# `pipeline` at c=1 and c=16 (--breakdown, $OUT/bench.txt) in process, served under three serving layouts (orchestrator
# replicas, micro-batches each: more micro-batches start steps more often, so a closed-loop client's next request waits
# less for one), and in process again, so that the ratios come from one machine. The rows go to $OUT/summary.txt; about
# 8 minutes of device time. Set up and carry as measure.sh's header says, then run `bash scripts/device/variants.sh`.
# Arguments, if any, are the layouts instead, with neither of the first two: "ORCHESTRATORS MICRO_BATCHES [colocate]"
# each, e.g. `bash scripts/device/variants.sh "2 1 colocate" "2 2"` (serving.colocate: every model in one replica's
# process).
set -u
O=${OUT:-/tmp/out}; C=scripts/device; mkdir -p $O
trap 'rm -f $C/v.yaml $O/t.txt' EXIT  # the layout's config sits beside serve.yaml: its model paths are relative
t0=$(date +%s); log() { echo "### $* [$(( $(date +%s) - t0 )) s]" | tee -a $O/summary.txt; }
. $C/serving.sh
profile() {
  timeout 120 $PY $C/profile_round.py $C/dlm.yaml > $O/profile.txt 2>&1; log "profile rc=$?"
  grep "^== " $O/profile.txt | tee -a $O/summary.txt
}
forwards() {
  timeout 150 $PY $C/replica_forward.py $C/serve.yaml 100 8 > $O/forward.txt 2>&1; log "replica forward rc=$?"
  grep -E '^(host|drafter|guider) ' $O/forward.txt | tee -a $O/summary.txt
}
bench() {  # CONFIG [--target ...]: pipeline at c=1 and c=16 with --breakdown; its rows to the summary
  timeout 120 $DLM --config $1 bench --strategy pipeline --max-new-tokens 48 --breakdown --concurrency 1,16 "${@:2}" > $O/t.txt 2>&1
  log "bench ${2:-in process} rc=$?"; cat $O/t.txt >> $O/bench.txt; grep -E '^ +(1|16) +[0-9]|Error' $O/t.txt | tee -a $O/summary.txt
}
layout() {  # orchestrator replicas, micro_batches[, colocate]
  sed -e "s/orchestrator: 2/orchestrator: $1/" $C/serve.yaml > $C/v.yaml; echo "    micro_batches: $2" >> $C/v.yaml
  [ "${3:-}" = colocate ] && echo "    colocate: true" >> $C/v.yaml
  serve_up $C/v.yaml $O/serve.log; up=$?
  log "layout orchestrators=$1 micro_batches=$2 ${3:-separate} up after $waited s"
  [ $up = 0 ] || { tail -20 $O/serve.log | tee -a $O/summary.txt; serve_down $C/v.yaml; return; }
  bench $C/v.yaml --target 127.0.0.1:50051
  serve_down $C/v.yaml
}
[ $# -gt 0 ] || { profile; forwards; set -- "1 2" "1 4" "2 2"; }
bench $C/dlm.yaml; for l in "$@"; do layout $l; done; bench $C/dlm.yaml
log done
