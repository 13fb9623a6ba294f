#!/usr/bin/env bash
# #20's figures on a lent GPU machine, in one device call: in process, served, in process again (c=1 and c=16, with
# --breakdown); served c=1 with overlap off, on (the whole window) and on guessing every count (guesses=16), taking
# turns, then follow=guider at lookahead 0 and 2; served again with one orchestrator replica (stop 40's layouts: 1 x 2
# micro-batches served c=16 fastest, on another lease); `dlm serve --local`, the same gRPC API and index with the
# models in process (README, "Serving, or splitting?"); every strategy's tokens (tokens.py); the --strategies
# baselines, following the drafter and the guider; the no-op round trip per transport. It first decodes one prompt in
# process, and ends there if that fails.
#
# Here, first: bash scripts/device/bundle.sh (Ray, the serving wheels and redis-server for the machine's Python 3.12)
# and .venv/bin/python -m services.serving.protogen (the gRPC stubs the call carries).
# The tree (43 MB) and the bundle (28 MB) exceed the tool's 64 MiB, so models/ar-base stays behind for the call:
#   git rm -r -q --cached models/ar-base && echo /models/ar-base/ >> .git/info/exclude
# then run `bash scripts/device/measure.sh` with carry [".gpu", "services/serving/_proto"] (about 8 minutes of
# device time), and afterwards: git reset -q -- models/ar-base && sed -i '/^\/models\/ar-base\/$/d' .git/info/exclude
# Commands of your own in the same call need its PYTHONPATH=/tmp/b/site:$PWD (Ray and the serving wheels).
# Results: $OUT/summary.txt (the table rows), $OUT/bench.txt (every breakdown), $OUT/tokens_gpu.json; compare the
# tokens with this machine's: DLM_DEVICE=cpu PYTHONPATH=. python scripts/device/tokens.py scripts/device/dlm.yaml cpu.json
set -u
O=${OUT:-/tmp/out}; C=scripts/device; mkdir -p $O
S=$O/summary.txt; L=$O/bench.txt
t0=$(date +%s)
log() { echo "### $* [$(date +%T), $(( $(date +%s) - t0 )) s]" | tee -a $S $L; }
. $C/serving.sh
log setup
{ nvidia-smi --query-gpu=name,memory.used,clocks.sm,clocks.max.sm --format=csv; nproc
  $PY -c "import torch, transformers, ray; print(torch.__version__, transformers.__version__, ray.__version__)"; } 2>&1 | tee -a $S
B="bench --strategy pipeline --max-new-tokens 48 --breakdown"
rows() { grep -E '^ +(1|16) +[0-9]' $1 | tee -a $S; grep -E 'Error|Traceback' $1 | head -3 | tee -a $S; }
inproc() { timeout 150 $DLM --config $C/dlm.yaml $B --concurrency 1,16 > $O/t.txt 2>&1; log "in process $1 rc=$?"; cat $O/t.txt >> $L; rows $O/t.txt; }
served() { timeout 120 $DLM --config $C/serve.yaml $B --concurrency $2 --target 127.0.0.1:50051 $3 > $O/t.txt 2>&1; log "served $1 $3 rc=$?"; cat $O/t.txt >> $L; rows $O/t.txt; }
timeout 90 $DLM --config $C/dlm.yaml generate "sort: 42 7 19 88 3 55" --stats > $O/t.txt 2>&1; rc=$?
log "smoke rc=$rc"; grep -v Loading $O/t.txt | tail -30 | tee -a $S; [ $rc = 0 ] || exit 1
inproc 1
serve_up $C/serve.yaml $O/serve.log; up=$?
log "serve up after $waited s"; [ $up = 0 ] || { tail -40 $O/serve.log | tee -a $S; exit 1; }
served 1 1,16 ""
for ov in false true 16 false true 16; do  # overlap off, on (the whole window), on guessing every count
  [ $ov = 16 ] && served ov 1 "--set overlap=true --set guesses=16" || served ov 1 "--set overlap=$ov"
done
for la in 0 2; do served la 1 "--set follow=guider --set lookahead=$la"; done
serve_down $C/serve.yaml; log "serve stopped"
DLM_SERVING__REPLICAS__ORCHESTRATOR=1 serve_up $C/serve.yaml $O/serve1.log; up=$?  # one orchestrator (2 above)
log "serve (1 orchestrator) up after $waited s"; [ $up = 0 ] && served one 1,16 ""; serve_down $C/serve.yaml
serve_up $C/serve.yaml $O/serve_local.log --local; up=$?  # the same API and index, the models in process
log "serve --local up after $waited s"; [ $up = 0 ] && served local 1,16 ""; serve_down $C/serve.yaml
inproc 2
timeout 100 $PY $C/tokens.py $C/dlm.yaml $O/tokens_gpu.json > $O/t.txt 2>&1; log "tokens rc=$?"; grep -v Loading $O/t.txt | tee -a $S
for f in "" "--set follow=guider"; do
  timeout 120 $DLM --config $C/dlm.yaml bench --strategies pipeline --max-new-tokens 48 --repeats 3 $f > $O/t.txt 2>&1
  log "baselines $f rc=$?"; grep -v Loading $O/t.txt | tail -8 | tee -a $S
done
timeout 120 $PY scripts/transport_rtt.py 300 > $O/t.txt 2>&1; log "transport rc=$?"; tail -9 $O/t.txt | tee -a $S
$PY -m ray.scripts.scripts stop --force > /dev/null 2>&1; rm -f $O/t.txt
log done
