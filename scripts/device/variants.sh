#!/usr/bin/env bash
# On a lent GPU machine, in one device call: where an in-process step goes (profile_round.py, $OUT/profile.txt), then
# served `pipeline` at c=1 and c=16 (--breakdown, $OUT/bench.txt) under three serving layouts (orchestrator replicas,
# micro-batches each), the default first and again last. The rows go to $OUT/summary.txt; about 5.5 minutes of device
# time. Set up and carry as measure.sh's header says, then run `bash scripts/device/variants.sh`.
set -u
export PYTHONUNBUFFERED=1
R=$PWD; O=${OUT:-/tmp/out}; C=scripts/device; mkdir -p $O
trap 'rm -f $C/v.yaml $O/t.txt' EXIT  # the layout's config sits beside serve.yaml: its model paths are relative
t0=$(date +%s); log() { echo "### $* [$(( $(date +%s) - t0 )) s]" | tee -a $O/summary.txt; }
[ -d /tmp/b/site ] || { mkdir -p /tmp/b && tar xJf .gpu/bundle.tar.xz -C /tmp/b; }
export PYTHONPATH=/tmp/b/site:$R REDIS_SERVER=/tmp/b/redis-server
PY=python3; DLM="$PY -m services.cli.cli"
timeout 120 $PY $C/profile_round.py $C/dlm.yaml > $O/profile.txt 2>&1; log "profile rc=$?"; grep "^== " $O/profile.txt | tee -a $O/summary.txt
layout() {  # orchestrator replicas, micro_batches
  sed -e "s/orchestrator: 2/orchestrator: $1/" $C/serve.yaml > $C/v.yaml; echo "    micro_batches: $2" >> $C/v.yaml
  setsid $DLM --config $C/v.yaml serve > $O/serve.log 2>&1 < /dev/null & srv=$!
  for i in $(seq 1 60); do sleep 2; grep -q 'serving on' $O/serve.log && break; kill -0 $srv 2> /dev/null || break; done
  log "layout orchestrators=$1 micro_batches=$2 up after $((i*2)) s"
  timeout 90 $DLM --config $C/v.yaml bench --strategy pipeline --max-new-tokens 48 --breakdown --concurrency 1,16 --target 127.0.0.1:50051 > $O/t.txt 2>&1
  log "bench rc=$?"; cat $O/t.txt >> $O/bench.txt; grep -E '^ +(1|16) +[0-9]|Error' $O/t.txt | tee -a $O/summary.txt
  pkill -INT -f "v.yaml serve"; for i in $(seq 1 15); do sleep 1; pgrep -f "v.yaml serve" > /dev/null || break; done
  $PY -m ray.scripts.scripts stop --force > /dev/null 2>&1; pkill -9 -f redis-server
}
layout 2 2; layout 1 1; layout 1 2; layout 2 2
log done
