#!/usr/bin/env bash
# Regenerates the Python gRPC code under sandboxd/v1 from proto/sandboxd/v1.
set -euo pipefail
cd "$(dirname "$0")/.."
rm -f sandboxd/v1/*_pb2*.py sandboxd/v1/*_pb2*.pyi
python3 -m grpc_tools.protoc -I proto \
  --python_out=. --grpc_python_out=. --pyi_out=. \
  proto/sandboxd/v1/*.proto
echo "generated: $(ls sandboxd/v1/*_pb2*.py | wc -l) files"
