"""The Flower ServerApp of federated class-incremental learning (``server.continual_app:app``):
sends the global model each round, merges the growing heads of the replies, evaluates, and
writes the results to the run's ``output`` file."""

from __future__ import annotations

import json
from pathlib import Path

from flwr.app import Context, Message, MessageType
from flwr.serverapp import Grid, ServerApp

from mgfl import continual_federation as cf

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    from client_runtime.device import Device
    from mgfl.data.registry import load_dataset
    from server.continual import run_rounds
    from server.continual_simulation import base_model, evaluator, summarize_run

    config = cf.FederatedIncrementalConfig.from_mapping(context.run_config)
    dataset = load_dataset(config.dataset)
    base, head = base_model(config, dataset)
    nodes = sorted(grid.get_node_ids())
    if len(nodes) != config.num_clients:
        raise ValueError(f"num-clients is {config.num_clients} but {len(nodes)} nodes joined")

    def send(contents):
        messages = [Message(content=c, dst_node_id=n, message_type=MessageType.TRAIN)
                    for c, n in zip(contents, nodes, strict=True)]  # fmt: skip
        replies = [r for r in grid.send_and_receive(messages) if r.has_content()]
        if len(replies) != len(messages):
            raise RuntimeError(f"{len(messages) - len(replies)} client(s) failed this round")
        return sorted((r.content for r in replies), key=lambda c: c[cf.METRICS_KEY]["client"])

    device = Device.open(config.device or None)
    _, history = run_rounds(config, base.init_state(config.seed), head, send,
                            evaluator(config, device, dataset))  # fmt: skip
    if config.output:
        Path(config.output).write_text(json.dumps(summarize_run(config, history), indent=2))
