"""The aggregator process: round loop, round driver, upload board, gRPC servicer, checkpoints."""
