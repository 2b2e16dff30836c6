"""The default federation (FSDD by speaker, DS-CNN, FedAvg, 5 local epochs of Adam) mirrored in
PyTorch, for comparing uplink compressors quickly: on a GPU a 20-round run takes about two
minutes, sixteen side by side about three. mgfl's own codecs encode and decode every update, so
the bytes are those of the real bundles; what differs from a deployment is only the engine that
trains (PyTorch's, from mgfl's initial weights) and the absence of Flower around it.

    python torch_mirror.py codec=stc:0.023
    python torch_mirror.py codec=stc:0.023 statistics=exact     # weights coded, statistics free
    python torch_mirror.py codec=none freeze-statistics-after=3
    python torch_mirror.py codec=stc:0.023 proximal-mu=1
    python torch_mirror.py candidate=random-mask fraction=0.18   # see mirror_candidates.py
    python torch_mirror.py codec=stc:0.038:3 statistics-every=5   # the run config's key

``statistics=exact`` is a diagnostic, not a codec: each client's statistics (measured on the model
the server will hold, as under stc) reach the server unquantised and uncounted, which shows what
the weights' coding alone costs. ``freeze-statistics-after=K`` trains with BatchNorm over its
running statistics after round K (they then stop moving and need not travel; the statistics of
rounds up to K travel as mgfl's codec sends them). ``statistics-every=K`` is the run config's
key: the statistics travel every K rounds and in the last. Tried and dropped (docs/federated.md):
``lookahead=1`` (a client trains on from the global model plus its unsent residual),
``residual-decay=D`` (the residual shrinks by D each round), ``server-lr=S`` (the server steps S
times the aggregated change of the trained arrays), ``project-every=N project-fraction=F`` (every N
local steps and at the end, the local change keeps only its largest F of entries). Prints one JSON
line: accuracy per round, mean uplink bytes per client and round, the ratio to float32, and a
candidate's ``report`` where it has one. ``plot_mirror.py`` compares runs seed by seed.
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np
import torch

from client_runtime.federated import client_data
from mgfl.bench.torch_reference import build_torch_model
from mgfl.codecs import encode_update, get_codec
from mgfl.data.registry import load_dataset
from mgfl.onnx_import import build_or_import_model
from mgfl.run_config import RunConfig
from mgfl.update_layout import UpdateLayout

FLOAT32_UPLINK = 98_129  # bytes of a float32 DS-CNN update (measured on the encoded bundle)


class Mirror:
    """The model, the clients' data and the training loop of one federation."""

    def __init__(self, options: dict[str, str]):
        self.rounds = int(options.get("num-rounds", 20))
        self.lr = float(options.get("lr", 0.004))
        self.epochs = int(options.get("epochs", 5))
        self.batch = int(options.get("batch", 32))
        self.seed = int(options.get("seed", 0))
        self.freeze_after = int(options.get("freeze-statistics-after", 10**9))
        self.proximal_mu = float(options.get("proximal-mu", 0.0))
        self.server_lr = float(options.get("server-lr", 1.0))
        self.lookahead = options.get("lookahead", "0") == "1"
        self.residual_decay = float(options.get("residual-decay", 1.0))
        self.project_every = int(options.get("project-every", 0))
        self.project_fraction = float(options.get("project-fraction", 0.023))
        config = RunConfig.from_mapping({"num-rounds": self.rounds, "statistics-every":
                                         int(options.get("statistics-every", 1))})
        self.config = config
        self.dataset = load_dataset(config.dataset)
        model = build_or_import_model(config.model, input_shape=self.dataset.input_shape,
                                      num_classes=self.dataset.num_classes)
        self.initial = model.init_state(config.model_seed)
        layout = UpdateLayout.of(model, set(model.parameter_shapes()))
        self.trained, self.buffers = list(layout.trainable), list(layout.buffers)
        self.clients = [client_data(config, i, 6) for i in range(6)]
        sizes = np.array([len(c.y_train) for c in self.clients], np.float64)
        self.client_weights = sizes / sizes.sum()
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        self.net = build_torch_model(torch, model, self.initial).to(self.device)
        self._on_device: dict = {}
        self.round = 0

    def tensor(self, name: str) -> torch.Tensor:
        path, attribute = name.rsplit(".", 1)
        return getattr(self.net[int(path.split(".")[1])], attribute)

    def load(self, state: dict[str, np.ndarray]) -> None:
        with torch.no_grad():
            for name, value in state.items():
                target = self.tensor(name)
                target.copy_(torch.from_numpy(np.asarray(value, np.float32))
                             .reshape(target.shape).to(self.device))

    def read(self, names: list[str]) -> dict[str, np.ndarray]:
        return {n: self.tensor(n).detach().cpu().numpy().reshape(self.initial[n].shape).copy()
                for n in names}

    def on_device(self, key, array: np.ndarray) -> torch.Tensor:
        if key not in self._on_device:
            self._on_device[key] = torch.from_numpy(np.ascontiguousarray(array)).to(self.device)
        return self._on_device[key]

    def batchnorms(self) -> list[torch.nn.BatchNorm2d]:
        return [m for m in self.net if isinstance(m, torch.nn.BatchNorm2d)]

    def train(self, state, client: int, seed: int) -> dict[str, np.ndarray]:
        """The client's local epochs from ``state``, batches drawn as mgfl's trainer draws them."""
        data = self.clients[client]
        self.load(state)
        self.net.train()
        if self.round > self.freeze_after:
            for bn in self.batchnorms():
                bn.eval()
        weights = [self.tensor(n) for n in self.trained]
        anchors = [w.detach().clone() for w in weights]
        optimizer = torch.optim.Adam(weights, lr=self.lr)
        x = self.on_device(("x", client), data.x_train.astype(np.float32))
        y = self.on_device(("y", client), data.y_train.astype(np.int64))
        rng = np.random.default_rng(seed)
        count = len(data.y_train)
        order, position = rng.permutation(count), 0
        steps = 0
        for _ in range(count // self.batch * self.epochs):
            if position + self.batch > count:
                order, position = rng.permutation(count), 0
            index = torch.from_numpy(order[position:position + self.batch]).to(self.device)
            position += self.batch
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(self.net(x[index]), y[index]).backward()
            optimizer.step()
            if self.proximal_mu:  # FedProx's pull, as client_runtime.proximal applies it
                with torch.no_grad():
                    for weight, anchor in zip(weights, anchors, strict=True):
                        weight -= self.lr * self.proximal_mu * (weight - anchor)
            steps += 1
            if self.project_every and steps % self.project_every == 0:
                self.project(weights, anchors)
        if self.project_every:
            self.project(weights, anchors)
        return self.read(self.trained + self.buffers)

    def project(self, weights, anchors) -> None:
        """Keeps only the ``project-fraction`` largest entries of the local change (over all
        trained arrays), so that training adapts to the sparse update it will send."""
        with torch.no_grad():
            change = torch.cat([(w - a).reshape(-1) for w, a in zip(weights, anchors,
                                                                    strict=True)])
            k = max(1, int(self.project_fraction * change.numel()))
            threshold = torch.topk(change.abs(), k).values[-1]
            for weight, anchor in zip(weights, anchors, strict=True):
                delta = weight - anchor
                weight.copy_(anchor + torch.where(delta.abs() >= threshold, delta, 0.0))

    def statistics(self, state, client: int, seed: int) -> dict[str, np.ndarray]:
        """Running statistics of ``state``'s weights over one pass of the client's samples,
        leaning on ``state``'s statistics as ``client_runtime.federated.measure_statistics``."""
        data = self.clients[client]
        self.load(state)
        self.net.train()
        x = self.on_device(("x", client), data.x_train.astype(np.float32))
        order = np.random.default_rng(seed + 1).permutation(len(data.y_train))
        with torch.no_grad():
            for start in range(0, len(order) - self.batch + 1, self.batch):
                self.net(x[torch.from_numpy(order[start:start + self.batch]).to(self.device)])
        return self.read(self.buffers)

    def statistics_change(self, sent, received, client: int, seed: int) -> dict[str, np.ndarray]:
        """The change of the statistics, measured on the client's samples for the model the
        server will hold (the received weights plus the sent update), as under a sparse codec."""
        held = {**received, **{n: received[n] + sent[n] for n in self.trained}}
        measured = self.statistics(held, client, seed)
        return {n: measured[n] - received[n] for n in self.buffers}

    def accuracy(self, state) -> float:
        self.load(state)
        self.net.eval()
        with torch.no_grad():
            logits = self.net(self.on_device("test", self.dataset.x_test.astype(np.float32)))
        return float((logits.argmax(1).cpu().numpy() == self.dataset.y_test).mean())


class CodecUplink:
    """An mgfl codec, used as the ClientApp uses it (statistics of the sent model under a sparse
    codec); with ``exact``, the statistics are replaced by exact, uncounted ones."""

    def __init__(self, mirror: Mirror, spec: str, exact: bool):
        self.mirror, self.codec, self.exact = mirror, get_codec(spec), exact
        self.buffer_codec = get_codec(RunConfig.from_mapping({"codec": spec})
                                      .uplink_buffer_codec())

    def __call__(self, client, changes, received, memory, seed):
        m, codec, buffer_codec = self.mirror, self.codec, self.buffer_codec
        codec_of = {n: buffer_codec for n in m.buffers}
        if m.round > m.freeze_after:  # statistics stay: nothing of them travels
            changes = {n: changes[n] for n in m.trained}
            codec_of = {}
        omit = () if m.config.sends_statistics(m.round) or not codec_of else m.buffers
        encoded = encode_update(changes, codec, memory.get("residual"),
                                np.random.default_rng(seed), codec_of=codec_of,
                                reference=received, omit=omit)
        if codec_of and not omit and (codec.sparse or self.exact):
            changes = {**changes, **m.statistics_change(encoded.sent, received, client, seed)}
            encoded = encode_update(changes, codec, memory.get("residual"),
                                    np.random.default_rng(seed), codec_of=codec_of,
                                    reference=received)
            sent = dict(encoded.sent)
            if self.exact:
                sent.update({n: changes[n] for n in m.buffers})
        else:
            sent = dict(encoded.sent)
        if codec.error_feedback or buffer_codec.error_feedback:
            memory["residual"] = encoded.residuals
        for name in m.buffers:
            sent.setdefault(name, np.zeros_like(received[name]))
        return sent, encoded.nbytes


def run(mirror: Mirror, uplink, label: str) -> dict:
    state = dict(mirror.initial)
    memories = [{} for _ in mirror.clients]
    accuracy, uplink_bytes = [mirror.accuracy(state)], []
    started = time.time()
    for server_round in range(1, mirror.rounds + 1):
        mirror.round = server_round
        total = {n: np.zeros(v.shape, np.float64) for n, v in state.items()}
        sizes = []
        for client in range(len(mirror.clients)):
            seed = int(np.random.SeedSequence([mirror.seed, server_round, client])
                       .generate_state(1)[0])
            memory = memories[client]
            start = state
            if memory.get("residual") and mirror.residual_decay != 1.0:
                memory["residual"] = {n: mirror.residual_decay * r
                                      for n, r in memory["residual"].items()}
            if mirror.lookahead and memory.get("residual"):
                # the client trains on from the global model plus what it has not yet sent
                residual = memory.pop("residual")
                start = {**state, **{n: state[n] + residual[n] for n in mirror.trained}}
            trained = mirror.train(start, client, seed)
            changes = {n: trained[n] - state[n] for n in mirror.trained + mirror.buffers}
            sent, nbytes = uplink(client, changes, state, memory, seed)
            sizes.append(nbytes)
            for name in state:
                total[name] += mirror.client_weights[client] * sent[name]
        step = {n: mirror.server_lr if n in mirror.trained else 1.0 for n in state}
        state = {n: (state[n] + step[n] * total[n]).astype(np.float32) for n in state}
        accuracy.append(mirror.accuracy(state))
        uplink_bytes.append(float(np.mean(sizes)))
    mean_bytes = float(np.mean(uplink_bytes))
    extra = {"report": uplink.report()} if hasattr(uplink, "report") else {}
    return {**extra, "run": label, "final_accuracy": accuracy[-1], "accuracy": accuracy,
            "uplink_bytes_per_client_round": round(mean_bytes, 1),
            "ratio_vs_float32": round(FLOAT32_UPLINK / mean_bytes, 1),
            "seconds": round(time.time() - started, 1)}


def main(argv: list[str]) -> None:
    if any(a in ("-h", "--help") for a in argv):
        print(__doc__)
        return
    malformed = [a for a in argv if "=" not in a]
    if malformed:
        raise SystemExit(f"arguments are key=value pairs (see --help), got {malformed}")
    options = dict(a.split("=", 1) for a in argv)
    torch.set_num_threads(int(options.get("threads", 2)))
    mirror = Mirror(options)
    if "candidate" in options:
        from mirror_candidates import build_candidate

        uplink = build_candidate(options["candidate"], mirror, options)
    else:
        uplink = CodecUplink(mirror, options.get("codec", "stc:0.023"),
                             options.get("statistics", "codec") == "exact")
    print(json.dumps(run(mirror, uplink, " ".join(argv))), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
