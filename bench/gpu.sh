#!/usr/bin/env bash
# The GPU benchmark as one prepared script (issues 5 and 17), within 10 minutes on one GPU.
#
#   bash bench/gpu.sh [OUT_DIR]        # default: $OUT, else ./out
#   STEPS="cuda build compile" bash bench/gpu.sh   # only some steps (a rerun on a warm machine)
#   bash bench/gpu.sh --check          # here, without a GPU: is the script ready for the bare device?
#                                      # (bench/gpu_check.py: the carry, its install, the imports, the budget)
#
# On the lent machine (Python 3.12, torch 2.11, no registry) the wheels it lacks travel in .whl/
# (python -m bench.carry builds them here); docs/performance.md gives the one device call.
#
# Steps, in this order (each under `timeout`, its output in OUT_DIR/<step>.log; a failing step is
# reported and the next one runs):
#   cuda     the device is there (torch.cuda and nvidia-smi)
#   build    a full-size SD 1.5 architecture with random weights (bench.sd15; no download; skipped
#            when the same build is already in $TMPDIR)
#   modes    image-to-image, inpainting and hires fix at 512 px in half precision through load_model,
#            each against a plain diffusers call of the mode pipeline; modes.json
#   bench    python -m bench --device cuda --quick on the SD 1.5 build (every section; bench-gpu.json
#            and bench-gpu.md), if at least 150 s of the budget are left
#   page     python -m bench.page on the SD 1.5 build at 512 and 1024 px: page users (live previews,
#            each fetched) against API users, server-process CPU per job and per step; page.json
#   lora     python -m bench.lora --quick on the SD 1.5 build at 512 px: mixed-adapter traffic (four tiny
#            LoRAs, eight callers) against single-adapter, mixed batches against separate loops; lora.json
#   compile  --compile against eager, in-process, through the app's own load_model: load + warm-up
#            time (the warm-up compiles), seconds per image at 512 px (20 steps; 1 step, the turbo
#            case), then a batch of 2 (a new shape: a recompile), and the images' difference from
#            eager; compile.json
#            (measured on an H200 2026-12-04: 191 s, so it comes after the serving benchmarks)
#   cache    (on request: STEPS="cuda build cache openloop", a call of its own) step caching, issue 50:
#            python -m bench.gpu_cache on the SD 1.5 build at 512 px (each method, 8 mixed callers,
#            the compiled loop's recompiles with a shrinking batch) and a full-width, full-depth
#            FLUX.1-dev transformer with random weights built on the device, 1024 px; cache.json
#   control  (on request, as cache) ControlNet, issue 51: python -m bench.control on the SD 1.5 build at
#            512 px, 20 steps, its ControlNet built from its UNet (random weights): one request with a
#            map against one without and the raw ControlNet pipeline; 8 callers (4 maps, 4 none) in one
#            loop against one at a time, a loop per kind and a whole call for the mapped; control.json
#   models   (on request, as cache) several models, issue 52: the SDXL-size build (python -m bench.sd15
#            --family sdxl, random weights) beside the SD 1.5 build on one device, python -m bench.models
#            at 512 px, 20 steps, under a budget that fits one: the switch from CPU memory and from the
#            device, a load from disk, mixed traffic against one model's and one at a time; models.json
#   openloop (on request, as cache) python -m bench.openloop --quick on the SD 1.5 build at 512 px,
#            20 steps: Poisson arrivals at four loads up to saturation, throughput against p50/p99
#            latency for one request at a time (none), the whole-handler lock (lock), step joining
#            with the cache off (step) and "auto" (cache); openloop.json
#   fast     the fast-device profiles of bench.fast --quick (a simulated device: the serving layer on
#            this machine's CPUs), 8 and 32 callers; the model side in a process and in a thread for
#            the SD-Turbo-like and launch-bound profiles; fast-<profile>.json. They need no GPU, so
#            they come last and get what the GPU steps left (a profile needs 30 s to start)
# At the end: summary.json (every step's status, exit code, seconds), also printed; the
# script exits 1 if any step failed or was skipped. The device tool brings back 8 files at most:
# docs/performance.md's call writes OUT_DIR elsewhere and packs it into one archive.
set -euo pipefail
cd "$(dirname "$0")/.."
py="${PYTHON:-$(command -v python3 || command -v python)}"  # the device's python3 is the one with torch
# Every step's `python` is it: a wrapper, not a link, since a venv's python linked from elsewhere
# finds no pyvenv.cfg beside the link and starts as the bare base interpreter (the device's torch is in a venv).
shim="$(mktemp -d)" && printf '#!/bin/sh\nexec "%s" "$@"\n' "$py" >"$shim/python" && chmod +x "$shim/python"
export PATH="$shim:$PATH"
if [[ "${1:-}" == "--check" ]]; then
  exec "$py" -m bench.gpu_check
fi
out="${1:-${OUT:-out}}"
mkdir -p "$out"
budget="${GPU_SH_BUDGET_S:-570}"  # every step ends by then: 10 minutes less a margin for the summary
end=$((SECONDS + budget))
steps="${STEPS:-cuda build modes bench page lora compile fast}"
model="${TMPDIR:-/tmp}/sd15-random"
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
summary=()
failures=0

wanted() { [[ " $steps " == *" $1 "* ]]; }

# step NAME CAP MIN CMD...: run CMD under `timeout` for at most CAP seconds (less if the budget is
# nearly spent; skipped if under MIN seconds are left), tee its output to $out/NAME.log, record it.
step() {
  local name=$1 cap=$2 min=$3 rc=0 t0=$SECONDS status
  shift 3
  local left=$((end - SECONDS))
  local limit=$((cap < left ? cap : left))
  if ((limit < min)); then
    echo "== $name: skipped, ${left}s of the budget left (needs ${min}s)"
    summary+=("{\"step\": \"$name\", \"status\": \"skipped\", \"rc\": null, \"seconds\": 0, \"limit_s\": $limit}")
    failures=$((failures + 1))
    return 0
  fi
  echo "== $name (limit ${limit}s): $*"
  timeout --kill-after=10 "$limit" "$@" 2>&1 | tee "$out/$name.log" || rc=$?
  if ((rc == 0)); then
    status=ok
  elif ((rc == 124 || rc == 137)); then
    status=timed_out
  else
    status=failed
  fi
  ((rc == 0)) || failures=$((failures + 1))
  echo "== $name: $status (rc $rc, $((SECONDS - t0))s)"
  summary+=("{\"step\": \"$name\", \"status\": \"$status\", \"rc\": $rc, \"seconds\": $((SECONDS - t0)), \"limit_s\": $limit}")
}

gpu_ok=0
if wanted cuda; then
  step cuda 60 10 bash -c 'nvidia-smi -L; python -c "import torch; assert torch.cuda.is_available(), \"no CUDA device\"; print(torch.cuda.get_device_name(0), torch.__version__)"'
  [[ "${summary[-1]}" == *'"ok"'* ]] && gpu_ok=1
else
  python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" && gpu_ok=1
fi

# GPU steps without a GPU: recorded as skipped rather than run to fail.
gpu_step() {
  if ((gpu_ok)); then
    step "$@"
  else
    echo "== $1: skipped, no CUDA device"
    summary+=("{\"step\": \"$1\", \"status\": \"skipped\", \"rc\": null, \"seconds\": 0, \"limit_s\": 0}")
    failures=$((failures + 1))
  fi
}

wanted build && gpu_step build 150 30 python -m bench.sd15 --out "$model" --dtype float16

if wanted modes; then
  # The image modes (issue 38) on the real device in half precision: image-to-image, inpainting and
  # hires fix through the app's load_model, each against a plain diffusers call of the family's mode
  # pipeline (the same components, CPU generators: the same noise), seconds per image, finite pixels.
  gpu_step modes 80 20 python - "$model" "$out/modes.json" <<'PY'
import json, sys, threading, time

import numpy as np
import torch
from PIL import Image

from pipeline.config import load_settings
from pipeline.engine.model.loading import load_model
from pipeline.protocol import InferenceJob

model_path, out_path = sys.argv[1], sys.argv[2]
model = load_model(load_settings(["--model", model_path, "--device", "cuda"]))
rng = np.random.default_rng(3)
source = Image.fromarray(rng.integers(0, 256, (512, 512, 3), dtype=np.uint8))
hole = np.zeros((512, 512), dtype=np.uint8)
hole[128:384, 128:384] = 255
hole = Image.fromarray(hole)
base = dict(prompts=("a red circle on a blue background",), negative_prompts=("",), seeds=(7,), width=512,
            height=512, num_inference_steps=20, guidance_scale=7.5)
jobs = {
    "text": InferenceJob("text", **base),
    "image_0.6": InferenceJob("image", **base, mode="image", images=(source,), strength=0.6),
    "inpaint_1.0": InferenceJob("inpaint", **base, mode="inpaint", images=(source,), masks=(hole,), strength=1.0),
    "hires_1.5x": InferenceJob("hires", **base, hires_width=768, hires_height=768, hires_steps=20, hires_strength=0.5),
}
result = {"model": "SD 1.5 architecture, random weights", "dtype": str(model.pipe.unet.dtype),
          "modes": list(model.profile.modes), "rows": {}}


def plain(name, j):
    from diffusers import AutoPipelineForImage2Image, AutoPipelineForInpainting
    auto = AutoPipelineForInpainting if j.mode == "inpaint" else AutoPipelineForImage2Image
    pipe = auto.from_pipe(model.pipe)
    pipe.set_progress_bar_config(disable=True)
    extra = {"mask_image": list(j.masks), "width": 512, "height": 512} if j.mode == "inpaint" else {}
    with torch.inference_mode():
        return pipe(prompt=list(j.prompts), negative_prompt=list(j.negative_prompts), image=list(j.images),
                    strength=j.strength, num_inference_steps=j.num_inference_steps, guidance_scale=j.guidance_scale,
                    generator=[torch.Generator("cpu").manual_seed(s) for s in j.seeds], **extra).images[0]


for name, j in jobs.items():
    times, steps = [], []
    for _ in range(3):
        steps.clear()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        done = model.generate(j, threading.Event(), lambda step, total, _p: steps.append((step, total)))
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    assert done.ok, done
    ours = np.asarray(done.images[0]).astype(int)
    row = {"first_s": round(times[0], 3), "median_s": round(sorted(times)[1], 4), "steps_reported": len(steps),
           "steps_run": j.steps_run, "size": list(done.images[0].size), "pixel_std": round(float(ours.std()), 2)}
    if j.mode != "text":
        row["vs_plain_max_levels"] = int(np.abs(ours - np.asarray(plain(name, j)).astype(int)).max())
    result["rows"][name] = row
    print(name, row, flush=True)
    with open(out_path, "w") as f:
        json.dump(result, f, indent=1)
PY
fi

if wanted bench; then
  gpu_step bench 300 150 bash -c "set -o pipefail; python -m bench --device cuda --model '$model' --quick \
    --json '$out/bench-gpu.json' | tee '$out/bench-gpu.md'"
fi

if wanted page; then
  # Page users against API users on the real pipeline (issue 28): live previews on, every preview
  # fetched as a browser does, against previews off; server-process CPU per job and per step.
  # Each section's figures are written as it ends. (2026-12-04: both sections in 150 s timed out.)
  gpu_step page 240 60 python -m bench.page --model "$model" --sections model-512,model-1024 --rounds 2 \
    --json "$out/page.json"
fi

if wanted lora; then
  # Per-request LoRA adapters (issue 29): four tiny random LoRAs on the SD 1.5 build, mixed-adapter
  # traffic against single-adapter traffic, mixed batches against a loop per adapter, the switch's cost.
  # (2026-12-04: 150 s were not enough: 4 loads, 3 warm loops and 6 rounds of 16 at 512 px, 20 steps)
  gpu_step lora 240 60 python -m bench.lora --quick --model "$model" --size 512 --steps 20 --json "$out/lora.json"
fi

if wanted compile; then
  gpu_step compile 200 60 python - "$model" "$out/compile.json" <<'PY'
"""Eager against --compile (mode="reduce-overhead": CUDA graphs), in-process, through load_model."""
import dataclasses, gc, json, sys, threading, time

import numpy as np
import torch

from pipeline.config import load_settings
from pipeline.engine.model.loading import load_model
from pipeline.engine.model.speedups import is_compiled
from pipeline.protocol import InferenceJob

model_path, out_path = sys.argv[1], sys.argv[2]
result = {"model": "SD 1.5 architecture, random weights, fp16", "device": torch.cuda.get_device_name(0),
          "torch": torch.__version__, "dynamo_recompile_limit": None}


def save() -> None:
    with open(out_path, "w") as f:
        json.dump(result, f, indent=1)


def job(steps: int, n: int = 1) -> InferenceJob:  # guidance 7.5: CFG, a UNet batch of 2n
    return InferenceJob(f"j{steps}-{n}", ("a red circle on a blue background",) * n, ("",) * n,
                        tuple(range(n)), 512, 512, steps, 7.5)


def timed(model, j):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    images = model.generate(j, threading.Event(), lambda *_: None).images
    torch.cuda.synchronize()
    return time.perf_counter() - t0, [np.asarray(i, dtype=np.int16) for i in images]


# The warm-up shape first (512 px, one image, CFG), then the batch of two: a new shape.
JOBS = {"512px_20steps": (job(20), 3), "512px_1step": (job(1), 10), "512px_4steps_batch2": (job(4, 2), 3)}
reference = {}
for flags in ([], ["--compile"]):
    key = "compiled" if flags else "eager"
    t0 = time.perf_counter()
    model = load_model(load_settings(["--model", model_path, "--device", "cuda", *flags]))
    row = {"load_and_warmup_s": round(time.perf_counter() - t0, 2), "denoiser_compiled": is_compiled(model.pipe.unet)}
    result[key] = row
    result["dynamo_recompile_limit"] = torch._dynamo.config.recompile_limit
    save()
    for name, (j, repeats) in JOBS.items():
        first, images = timed(model, j)  # compiled: a new shape compiles here
        times = sorted(timed(model, j)[0] for _ in range(repeats))
        row[name] = {"first_s": round(first, 3), "median_s": round(times[len(times) // 2], 4)}
        if key == "eager":
            reference[name] = images
        else:
            diff = np.abs(np.stack(images) - np.stack(reference[name]))
            row[name] |= {"vs_eager_mean_levels": float(diff.mean()), "vs_eager_max_levels": int(diff.max())}
            row[name]["speedup"] = round(result["eager"][name]["median_s"] / row[name]["median_s"], 3)
        save()
        print(key, name, row[name], flush=True)
    # The step-level loop, as the app serves: a member joins at step 2 and leaves before the first ends
    # (rows 2 -> 6 -> 2). After the warm-up a compiled denoiser must not recompile (issue 36 §4).
    from torch._dynamo.utils import counters
    from pipeline.engine.loop.joining import LoopDriver

    ended = {}
    class Task:
        def __init__(self, j):
            self.job, self.stop = j, threading.Event()
        def emit(self, event):
            ended[self.job.request_id] = event
    first, joiner = Task(job(8)), Task(job(3, 2))
    joiner.job = dataclasses.replace(joiner.job, request_id="joiner", joinable=True)
    first.job = dataclasses.replace(first.job, joinable=True)
    pending, graphs = [joiner], counters["stats"]["unique_graphs"]
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    loop = model.open_loop(first.job)
    LoopDriver(loop, lambda: pending.pop() if pending and loop.steps_done(0) >= 2 else None).run(first)
    torch.cuda.synchronize()
    row["loop_join_leave"] = {"seconds": round(time.perf_counter() - t0, 3),
                              "recompiles": counters["stats"]["unique_graphs"] - graphs,
                              "results": sorted(type(e).__name__ for e in ended.values())}
    print(key, "loop_join_leave", row["loop_join_leave"], flush=True)
    row["peak_memory_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    save()
    del model
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
print(json.dumps(result, indent=1))
PY
fi

if wanted cache; then
  gpu_step cache 420 60 python -m bench.gpu_cache --model "$model" --device cuda --json "$out/cache.json"
fi

if wanted control; then
  gpu_step control 300 60 python -m bench.control --model "$model" --device cuda --size 512 --steps 20 \
    --rounds 2 --json "$out/control.json"
fi

if wanted models; then
  sdxl="${TMPDIR:-/tmp}/sdxl-random"
  gpu_step models-build 300 60 python -m bench.sd15 --family sdxl --out "$sdxl" --dtype float16
  gpu_step models 420 60 python -m bench.models --model "$model" --second "$sdxl" --device cuda --size 512 \
    --steps 20 --rounds 2 --json "$out/models.json"
fi

if wanted openloop; then
  gpu_step openloop 420 60 python -m bench.openloop --quick --model "$model" --size 512 --steps 20 \
    --designs none,lock,step,cache --loads 0.5,0.8,0.95,1.1 --json "$out/openloop.json"
fi

if wanted fast; then
  # The simulated device needs no GPU: these measure the serving layer on this machine's CPUs, with
  # what the GPU steps left of the budget, the issue's headline profiles first. profile:cap:sides:callers
  for plan in sd-turbo-like:90:process,thread:8,32 launch-bound:90:process,thread:8,32 null:60:process:8,32 \
    sdxl-turbo-like-1024:60:process:8,32 sd15-like:60:process:8; do
    IFS=: read -r name cap sides clients <<<"$plan"
    step "fast-$name" "$cap" 30 python -m bench.fast --quick --profiles "$name" --clients "$clients" \
      --model-side "$sides" --json "$out/fast-$name.json"
  done
fi

{
  echo "["
  for i in "${!summary[@]}"; do
    sep=","
    ((i == ${#summary[@]} - 1)) && sep=""
    echo "  ${summary[$i]}$sep"
  done
  echo "]"
} >"$out/summary.json"
echo
echo "step summary ($SECONDS s of ${budget}s; output in $out):"
cat "$out/summary.json"
((failures == 0)) || {
  echo "$failures step(s) failed, timed out or were skipped"
  exit 1
}
