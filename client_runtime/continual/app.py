"""The Flower ClientApp of federated class-incremental learning
(``client_runtime.continual.app:app``): each node trains on its IID share of the data set, keeps
its exemplar memory in its own ``Context.state``, and replies with its model only."""

from __future__ import annotations

from functools import lru_cache

from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from client_runtime.continual.federated import client_round
from client_runtime.device import Device
from mgfl import continual_federation as cf

app = ClientApp()


@lru_cache(maxsize=1)
def _dataset(spec: str):
    from mgfl.data.registry import load_dataset

    return load_dataset(spec)


@lru_cache(maxsize=2)
def _device(selection: str) -> Device:
    return Device.open(selection or None)


@app.train()
def train(msg: Message, context: Context) -> Message:
    from server.continual_simulation import base_model, client_shares

    config = cf.FederatedIncrementalConfig.from_mapping(dict(msg.content[cf.CONFIG_KEY]))
    client = int(context.node_config["partition-id"])
    dataset = _dataset(config.dataset)
    share = client_shares(config, dataset.y_train, dataset.groups_train)[client]
    base, _ = base_model(config, dataset)
    x, y = dataset.x_train[share], dataset.y_train[share]
    device = _device(config.device)
    content = client_round(msg.content, context, device, base, x, y, config, client)
    return Message(content=content, reply_to=msg)
