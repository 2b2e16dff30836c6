"""One federation in one process, for quick comparisons of run configurations: the project's
ServerApp logic (``server.run.run_server``) with a grid whose nodes call the project's ClientApp
directly, one after the other. No Ray, no SuperLink, no transport; the messages, records, codecs,
strategy and client code are the same objects a real run uses.

    python examples/simulation/in_process.py num-rounds=5 codec=stc:0.023 output-dir=runs/a

Arguments are run-config pairs (``mgfl.run_config``); prints the accuracy of every round as JSON.
Use ``mgfl simulate`` (Flower's simulation engine) or a deployment for figures you publish.
"""

from __future__ import annotations

import ast
import json
import os
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from uuid import uuid4

from flwr.app import Context, Message, RecordDict
from flwr.serverapp import Grid
from flwr.supercore.task_identity import TaskIdentity

from client_runtime.app import app as client_app
from client_runtime.device import crash_prone_driver_opened
from mgfl.run_config import RunConfig
from server.run import run_server
from server.simulation import supernode_count


class InProcessGrid(Grid):
    """Nodes 1..n, each with its own persistent context (partition, state across rounds); a
    message is answered by calling the ClientApp with it at once."""

    def __init__(self, nodes: int, run_config: dict):
        self.contexts = {
            node: Context(run_id=1, node_id=node,
                          node_config={"partition-id": node - 1, "num-partitions": nodes},
                          state=RecordDict(), run_config=run_config)
            for node in range(1, nodes + 1)}
        self.replies: dict[str, Message] = {}

    def set_run(self, run) -> None:
        """Runs are not tracked: there is one."""

    @property
    def run(self):
        return None

    def create_message(self, content: RecordDict, message_type: str, dst_node_id: int,
                       group_id: str, ttl: float | None = None) -> Message:
        return Message(content, dst_node_id=dst_node_id, message_type=message_type,
                       group_id=group_id)

    def get_node_ids(self) -> list[int]:
        return list(self.contexts)

    def push_messages(self, messages: Iterable[Message]) -> list[str]:
        ids = []
        for message in messages:
            message.metadata.__dict__["_message_id"] = str(uuid4())  # as Flower's own grids do
            node = message.metadata.dst_node_id
            self.replies[message.metadata.message_id] = client_app(message, self.contexts[node])
            ids.append(message.metadata.message_id)
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> list[Message]:
        return [self.replies.pop(i) for i in message_ids if i in self.replies]

    def send_and_receive(self, messages: Iterable[Message], *,
                         timeout: float | None = None) -> list[Message]:
        return self.pull_messages(self.push_messages(messages))


def run_in_process(settings: dict) -> tuple[dict, InProcessGrid]:
    """Runs the federation ``settings`` describes; returns its history (with ``wall_s``) and the
    grid, whose nodes' contexts hold what each client kept between rounds."""
    TaskIdentity.run_id, TaskIdentity.task_id, TaskIdentity.node_id = 1, 1, 0
    config = RunConfig.from_mapping(settings)
    grid = InProcessGrid(supernode_count(config), config.to_mapping())
    started = time.perf_counter()
    run_server(grid, config)
    history = json.loads((Path(config.output_dir) / "history.json").read_text())
    history["wall_s"] = time.perf_counter() - started
    return history, grid


def parse_pairs(arguments: list[str]) -> dict:
    """``["num-rounds=3", "codec=fp16"]`` -> ``{"num-rounds": 3, "codec": "fp16"}``."""
    pairs = {}
    for argument in arguments:
        key, separator, text = argument.partition("=")
        if not separator:
            raise SystemExit(f"{argument!r}: write run-config pairs as key=value")
        try:
            pairs[key] = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            pairs[key] = text
    return pairs


def main() -> None:
    history, _ = run_in_process(parse_pairs(sys.argv[1:]))
    print(json.dumps({"final_accuracy": history.get("final_accuracy"),
                      "accuracy": [round(r["accuracy"], 4) for r in history["rounds"]],
                      "wall_s": round(history["wall_s"], 1)}), flush=True)
    if crash_prone_driver_opened():
        os._exit(0)  # NVIDIA's OpenCL driver can crash in interpreter teardown


if __name__ == "__main__":
    main()
