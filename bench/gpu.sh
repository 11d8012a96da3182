#!/usr/bin/env bash
# The GPU benchmark as one prepared script (issue 5): a full-size SD 1.5 architecture with random
# weights (no download), every section of `python -m bench` on CUDA. About 5 minutes on one GPU.
#
#   bash bench/gpu.sh [OUT_DIR]      # JSON and the markdown table land in OUT_DIR (default bench/results)
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-bench/results}"
mkdir -p "$out"
python -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.cuda.get_device_name(0))"
python -m bench.sd15 --out /tmp/sd15-random --dtype float16
python -m bench --device cuda --model /tmp/sd15-random --quick --json "$out/bench-gpu.json" | tee "$out/bench-gpu.md"
