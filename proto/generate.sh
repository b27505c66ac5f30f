#!/usr/bin/env bash
# Regenerate the gRPC modules in ordq/wire/ from proto/ (never edit them by hand).
# The proto path mirrors the Python package so generated imports are absolute and correct.
set -euo pipefail
cd "$(dirname "$0")/.."
python -m grpc_tools.protoc -I proto --python_out=. --grpc_python_out=. --pyi_out=. \
  proto/ordq/wire/ordq.proto
