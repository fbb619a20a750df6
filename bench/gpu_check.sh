#!/usr/bin/env bash
# The GPU checks of docs/GPU.md, on a lent machine with no network. Before it, onnxruntime-gpu (a 255 MB wheel,
# without its TensorRT provider, as one xz'd tar split in 60 MiB parts) was carried into /tmp/p over successive
# calls, and the pure wheels it needs beside the machine's own packages lie in .whl/.
#   bash bench/gpu_check.sh   (writes under $OUT)
set -uo pipefail
OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT" /tmp/site
t0=$SECONDS
cat /tmp/p/ort.* | xz -d | tar x -C /tmp/site || exit 1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
# onnxruntime-gpu finds the CUDA 13 libraries (cuBLAS, cuDNN, cuFFT, ...) of the machine's torch wheels here.
nv=$(python3 -c "import nvidia, os; print(list(nvidia.__path__)[0])")
export LD_LIBRARY_PATH=$(find "$nv" -name 'lib*.so*' -printf '%h\n' | sort -u | paste -sd:)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
echo "setup ${SECONDS}s"; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c "import onnxruntime as o, numpy, onnx; print('onnxruntime', o.__version__, o.get_available_providers(), 'numpy', numpy.__version__, 'onnx', onnx.__version__)"
if [ "${GPU_CHECK_BENCH:-1}" = 1 ]; then    # GPU_CHECK_BENCH=0: the tests alone
  timeout 300 python3 -m bench gpu_slots --provider CUDAExecutionProvider --out "$OUT/gpu_slots.json" > "$OUT/gpu_slots.log" 2>&1
  echo "bench rc=$? at ${SECONDS}s"; tail -c 3000 "$OUT/gpu_slots.log"
fi
left=$(( ${GPU_CHECK_SECONDS:-500} - SECONDS ))
timeout $(( left > 30 ? left : 30 )) python3 -m pytest -q -s -p no:cacheprovider -rs \
  tests/unit/test_device_cache.py tests/e2e/grpc/test_server_gpu.py \
  tests/export/test_export.py::test_optimized_fusion_counts_and_fp16_status tests/e2e/grpc/test_server_gpu_families.py tests/e2e/grpc/test_server_gpu_decoding.py \
  > "$OUT/pytest.log" 2>&1
echo "pytest rc=$? at ${SECONDS}s"; grep -E "^(w8|w4) |generation .*cache slots|GroupQueryAttention takes|fp16 gate passed|served fp16|CUDA fp16 vs|served fp16 beam" "$OUT/pytest.log" | cut -c1-600
tail -c 4000 "$OUT/pytest.log"
