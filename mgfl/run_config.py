"""The configuration of one federated run, shared by the ServerApp, the ClientApp and
``mgfl simulate``.

Flower hands a run configuration to both apps as flat ``key = value`` pairs (the pyproject's
``[tool.flwr.app.config]``, overridden by ``flwr run --run-config``). The server reads it, and
sends the same pairs to every client inside each training message, so that a client needs no
configuration of its own beyond its partition (its node configuration). Keys are the field names
with dashes: ``num_rounds`` is ``num-rounds``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields

STRATEGIES = ("fedavg", "fedprox", "fedadam", "fedavgm", "fedmedian", "fedtrimmedavg", "krum")


@dataclass(frozen=True)
class RunConfig:
    """Every setting of a federated run, with the embedded default: FSDD, one client per
    speaker, DS-CNN, FedAvg, float32 updates."""

    # rounds and data
    num_rounds: int = 20
    dataset: str = "fsdd"
    partition: str = "natural"  # natural | iid | dirichlet
    num_clients: int = 0  # 0: one client per natural group (speaker)
    dirichlet_alpha: float = 0.5
    partition_seed: int = 0
    # model
    model: str = "dscnn"
    model_seed: int = 0  # initial weights; frozen arrays are rebuilt from it on every client
    freeze: str = "all"  # trainable set: all | head | last:K | bias | names
    # server strategy (Flower's own)
    strategy: str = "fedavg"
    fraction_train: float = 1.0
    min_train_nodes: int = 2
    fraction_evaluate: float = 0.0  # federated evaluation on clients; the server always evaluates
    proximal_mu: float = 0.01  # FedProx
    server_lr: float = 1.0  # FedAvgM
    server_momentum: float = 0.9  # FedAvgM
    adam_eta: float = 0.01  # FedAdam server learning rate
    adam_tau: float = 0.001  # FedAdam adaptivity
    trim_beta: float = 0.2  # FedTrimmedAvg: fraction cut at each end
    krum_malicious: int = 0  # Krum: number of malicious clients to tolerate
    # local training on each client
    epochs: int = 5
    local_steps: int = 0  # > 0: this many steps instead of epochs
    batch: int = 32
    lr: float = 0.004
    optimizer: str = "adam"  # adam | sgd (Adam's moments restart every round)
    momentum: float = 0.9
    weight_decay: float = 0.0
    memory_budget: str = ""  # e.g. "64MB": the batch shrinks until the step fits
    seed: int = 0  # batch order and top-k rounding; mixed with round and partition
    # updates
    codec: str = "none"  # uplink: none | fp16 | int8 | int8-channel | topk:F | stc:F[:B]
    buffer_codec: str = "auto"  # BatchNorm statistics; auto = the uplink codec, int8 if sparse
    downlink_codec: str = "none"  # none | fp16 (dense codecs only: clients start from it)
    statistics_every: int = 1  # BatchNorm statistics travel every K rounds and in the last
    # where things happen
    device: str = ""  # OpenCL device of clients and server evaluation; "" = MGFL_DEVICE or auto
    eval_batch: int = 100
    output_dir: str = "mgfl-run"  # checkpoints (round-NNN.npz) and history.json
    # reliability (docs/reliability.md)
    max_update_bytes: int = 0  # largest reply accepted; 0 = the float32 size of what travels
    update_norm_bound: float = 0.0  # > 0: replies whose change has a larger L2 norm are refused
    min_replies: int = 1  # fewer accepted replies than this: the round keeps the global model
    fault_crash: float = 0.0  # simulation only: share of training replies turned into crashes
    fault_timeout: float = 0.0  # ... that never come back
    fault_late: float = 0.0  # ... that come back after the round closed
    fault_seed: int = 0
    resume: int = 0  # 1: continue from output-dir/server-state.json if it exists
    # simulated phones (docs/deploy.md): each client gets a phone GPU profile and an uplink
    devices: str = ""  # "" = none | mix (one of every profiled GPU, seeded) | a profile name
    over_selection: float = 0.0  # 0.3: sample 30% more clients than needed, keep the first
    round_deadline_s: float = 0.0  # simulated seconds a round waits; 0 = no deadline
    uplink_mbps: float = 10.0  # median uplink per client, Mbit/s (lognormal spread)

    @classmethod
    def from_mapping(cls, values: Mapping[str, object]) -> RunConfig:
        """Reads ``key = value`` pairs (dashed keys), checking names and types; keys not named
        here are refused with the list of known ones, so a typo cannot pass silently."""
        known = {f.name.replace("_", "-"): f for f in fields(cls)}
        unknown = sorted(set(values) - set(known) - IGNORED_KEYS)
        if unknown:
            raise ValueError(
                f"unknown run-config key(s) {', '.join(unknown)}; known: {', '.join(known)}"
            )
        parsed = {}
        for key, field in known.items():
            if key in values:
                parsed[field.name] = _coerce(key, values[key], field.type)
        config = cls(**parsed)
        config.check()
        return config

    def to_mapping(self) -> dict[str, int | float | str]:
        """Dashed ``key: value`` pairs, as Flower's run config and ConfigRecord hold them."""
        return {name.replace("_", "-"): value for name, value in asdict(self).items()}

    def check(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ValueError(f"strategy {self.strategy!r}: choose one of {', '.join(STRATEGIES)}")
        if self.num_rounds < 1:
            raise ValueError("num-rounds must be at least 1")
        if not 0.0 < self.fraction_train <= 1.0:
            raise ValueError("fraction-train must lie in (0, 1]")
        if not 0.0 <= self.fraction_evaluate <= 1.0:
            raise ValueError("fraction-evaluate must lie in [0, 1]")
        if self.batch < 1 or self.eval_batch < 1:
            raise ValueError("batch and eval-batch must be at least 1")
        if self.epochs < 1 and self.local_steps < 1:
            raise ValueError("train at least one epoch or one local step")
        faults = (self.fault_crash, self.fault_timeout, self.fault_late)
        if any(f < 0 for f in faults) or sum(faults) > 1:
            raise ValueError("fault-crash, fault-timeout and fault-late are shares summing to <= 1")
        if self.statistics_every < 1:
            raise ValueError("statistics-every must be at least 1 (1: every round)")
        if self.max_update_bytes < 0 or self.update_norm_bound < 0 or self.min_replies < 0:
            raise ValueError("max-update-bytes, update-norm-bound and min-replies must be >= 0")
        from mgfl.codecs import get_codec

        get_codec(self.codec)
        get_codec(self.uplink_buffer_codec())
        if get_codec(self.downlink_codec).name not in ("none", "fp16"):
            raise ValueError("downlink-codec must be none or fp16: clients train from what arrives")
        self.check_fleet()

    def check_fleet(self) -> None:
        """The simulated-phone keys: a known profile, non-negative shares and times."""
        if self.devices.strip():
            from mgfl.simulated_phone import check_devices

            check_devices(self.devices)
        if self.over_selection < 0 or self.round_deadline_s < 0:
            raise ValueError("over-selection and round-deadline-s must be >= 0")
        if not self.devices.strip() and (self.over_selection or self.round_deadline_s):
            raise ValueError("over-selection and round-deadline-s order clients by simulated "
                             "time: set devices (mix or a profile name) too")
        if self.uplink_mbps <= 0:
            raise ValueError("uplink-mbps must be positive")

    def sends_statistics(self, server_round: int) -> bool:
        """Whether clients send their BatchNorm running statistics in ``server_round``: every
        ``statistics-every`` rounds, and always in the last so that the final model evaluates
        with fresh ones. Training normalises with batch statistics (a BatchNorm with frozen
        statistics runs over ones that never move), so the running ones matter only to
        evaluation: with a sparse codec their bytes buy more weights' entries instead
        (docs/federated.md). A round the client does not know (0) sends them."""
        return (self.statistics_every == 1 or server_round <= 0
                or server_round % self.statistics_every == 0 or server_round >= self.num_rounds)

    def uplink_buffer_codec(self) -> str:
        """The codec of the BatchNorm statistics' change. A sparse codec would starve them (a
        64-entry running mean at 0.1% travels one entry in sixteen rounds) and the server's
        evaluation depends on them, so with ``auto`` they go dense in int8 then. A codec that
        encodes whole updates (stc) codes the statistics itself."""
        if self.buffer_codec != "auto":
            return self.buffer_codec
        from mgfl.codecs import get_codec

        codec = get_codec(self.codec)
        if codec.whole_update:
            return codec.spec
        return "int8" if codec.sparse else self.codec


# Keys the server adds to the training configuration: Flower's round number, and the digest
# of the frozen arrays (``UpdateLayout.frozen_digest``).
IGNORED_KEYS = frozenset({"server-round", "frozen-digest"})
_TYPES = {"int": int, "float": float, "str": str}


def _coerce(key: str, value: object, annotation: str) -> int | float | str:
    kind = _TYPES[annotation]
    if kind is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if kind is int and isinstance(value, int) and not isinstance(value, bool):
        return value
    if kind is int and isinstance(value, float) and value.is_integer():
        return int(value)
    if kind is str and isinstance(value, str):
        return value
    raise ValueError(f"run-config {key} = {value!r}: expected {getattr(kind, '__name__', kind)}")
