"""gRPC servicers and interceptors: decode, call the core, encode."""
