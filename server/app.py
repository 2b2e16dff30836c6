"""The Flower ServerApp of mgfl (``server.app:app``): reads the run configuration and runs the
rounds (``server.run``). Flower starts it both in simulation and in deployment."""

from __future__ import annotations

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from mgfl.run_config import RunConfig
from server.run import run_server

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Runs the federated rounds the run configuration describes."""
    run_server(grid, RunConfig.from_mapping(context.run_config))
