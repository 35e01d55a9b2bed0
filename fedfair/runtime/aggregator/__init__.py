"""The aggregator process: round loop, round driver, board, gRPC servicer, checkpoints, command."""
