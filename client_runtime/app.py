"""The Flower ClientApp of mgfl (``client_runtime.app:app``): trains on the node's OpenCL device
with mgfl's engine and answers with encoded updates (``client_runtime.federated``)."""

from __future__ import annotations

from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from client_runtime.federated import evaluate_round, train_round

app = ClientApp()


@app.train()
def train(msg: Message, context: Context) -> Message:
    """One round of local training; replies with the encoded change and the round's metrics."""
    return Message(content=train_round(msg.content, context), reply_to=msg)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    """Evaluates the received global model on this client's held-out samples."""
    return Message(content=evaluate_round(msg.content, context), reply_to=msg)
