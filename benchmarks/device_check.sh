#!/usr/bin/env bash
# One prepared device check of the fused step (issue 32): the CUDA test tier and the fusion
# benchmark, eager against graphed, written as JSON with the commit. GPU time is short, so this
# is the whole run, under 8 minutes on one H100:
#
#   benchmarks/device_check.sh                      # --device cuda: the full check
#   benchmarks/device_check.sh --device cpu --quick # the same steps, tiny, on a CPU (slow-tier test)
#
# On a bare GPU machine it first installs what is missing from wheels carried with the working
# tree (shared/wheels/ or wheels/), with no index and no network: pip install --no-index.
# JSON goes to $OUT when set, else to benchmarks/results/:
#   device_check_<device>.json        commit, device, torch, the pytest outcome and every row
#                                     (fused/serial step ms, launches per step, TFLOP/s on CUDA)
#   device_check_<device>_w<W>.json   each width's benchmark, written as soon as it is done
# Full run: the MLP and the char-GPT proxy at width 64 and 512, 6 layers, B = 1, 16, 64, 128,
# fp32 and bf16, --compile off,graphs (side by side). --quick: width 32, 2 layers, B = 1, 2, fp32, 2 steps.
set -euo pipefail

device=cuda
quick=0
while [ $# -gt 0 ]; do
    case "$1" in
        --device) device="$2"; shift 2 ;;
        --quick) quick=1; shift ;;
        *) echo "device_check.sh: unknown argument '$1' (expected --device cpu|cuda, --quick)" >&2; exit 2 ;;
    esac
done
case "$device" in cpu|cuda) ;; *) echo "device_check.sh: --device is '$device'; expected cpu or cuda" >&2; exit 2 ;; esac

repo="$(cd "$(dirname "$0")/.." && pwd)"
cd "$repo"
python="${PYTHON:-python3}"
out="${OUT:-$repo/benchmarks/results}"
mkdir -p "$out"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

for wheels in shared/wheels wheels; do
    if [ -d "$wheels" ] && ! "$python" -c "import torch, pytest" 2>/dev/null; then
        "$python" -m pip install --no-index --find-links "$wheels" torch pytest numpy
    fi
done

if [ "$quick" = 1 ]; then
    widths="32"; members="1,2"; extra=(--layers 2 --block 16 --batch 8 --steps 2 --repeats 1 --serial-cap 1); dtypes="fp32"; modes="off"
else
    widths="64 512"; members="1,16,64,128"; extra=(--layers 6 --steps 10 --repeats 2 --serial-cap 2); dtypes="fp32,bf16"; modes="off,graphs"
fi
[ "$device" = cpu ] && [ "$quick" = 0 ] && dtypes="fp32" && modes="off,inductor"

# mup (hpo/scaling) and PyYAML are pure Python and the GPU machine has neither: copy them from the
# venv into the ignored .devdeps/ and carry that folder (run's carry: [".devdeps"]):
#   mkdir -p .devdeps && cp -r .venv/lib/python3.11/site-packages/{mup,yaml} .devdeps/
pythonpath="$repo"
[ -d "$repo/.devdeps" ] && pythonpath="$repo:$repo/.devdeps"
pytest_status=skipped
if [ "$device" = cuda ]; then
    # The project's addopts name a plugin the GPU machine lacks (pytest-instafail).
    # The fusion modules' CUDA tests: the machine has no Ray or DeepSpeed, which the others import.
    if PYTHONPATH="$pythonpath" timeout 240 "$python" -m pytest -q -o addopts="" -p no:cacheprovider -m cuda $(grep -l "pytest.mark.cuda" tests/test_fusion*.py) >"$out/device_check_pytest_${device}.log" 2>&1; then pytest_status=passed; else pytest_status=failed; fi
    tail -15 "$out/device_check_pytest_${device}.log"
fi

runs=()
for width in $widths; do
    # the paths side by side: timed in the same rounds, one row each
    # beside the summary, so the widths already run survive a run cut short by its time limit
    json="$out/device_check_${device}_w${width}.json"
    PYTHONPATH="$pythonpath" "$python" benchmarks/fusion_throughput.py --device "$device" --models mlp,char_gpt \
        --width "$width" --members "$members" --dtypes "$dtypes" --compile "$modes" --no-concurrent "${extra[@]}" --json "$json"
    runs+=("$json")
done

PYTHONPATH="$repo" "$python" - "$out/device_check_${device}.json" "$pytest_status" "${runs[@]}" <<'PY'
import json, sys
target, pytest_status, runs = sys.argv[1], sys.argv[2], [json.load(open(p)) for p in sys.argv[3:]]
rows = [dict(row, width=run["models"]["mlp"]["width"]) for run in runs for row in run["rows"]]
summary = {
    "commit": runs[0]["commit"],
    "device": runs[0]["machine"]["device"],
    "torch": runs[0]["machine"]["torch"],
    "pytest_cuda": pytest_status,
    "launches_per_step": {f'{r["model"]}/w{r["width"]}/{r["dtype"]}/B{r["B"]}/{r["compile"]}': r["fused_launches_per_step"] for r in rows},
    "rows": rows,
}
json.dump(summary, open(target, "w"), indent=2)
print(f"wrote {target}")
PY
[ "$pytest_status" != failed ]
