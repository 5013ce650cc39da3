"""Generated gRPC code for the sandboxd.v1 API (see proto/sandboxd/v1; rebuild with scripts/gen_protos.sh)."""
